"""HTTP clients for the load generator: keep-alive connections without a cap, and without a slow pool.

``vllm bench serve`` shares one aiohttp session across all requests. The httpx equivalent, one
``AsyncClient`` with ``Limits(max_connections=None)``, is correct but gets slower per request as
connections accumulate: httpcore 1.0's pool re-scans every connection for every queued request
(``_assign_requests_to_connections`` is O(connections × requests); encode/httpcore#1035, fixed
only in forks). Measured here with 1-token requests against a zero-work server: 3.8 / 6.2 /
10.0 ms of client CPU per request at 16 / 64 / 256 concurrent requests, against a flat 1.8 ms
when each in-flight request has a client of its own.

So the load generator uses *lanes*: a free list of clients, each carrying at most one request at
a time (hence one keep-alive connection). A request takes the most recently freed lane (its
connection is the warmest), and a new lane is opened only when every lane is busy, so the number
of connections follows the real concurrency with no cap, exactly like a shared pool, while each
pool lookup stays O(1). The lanes share one SSL context, so opening one costs no certificate load,
and a plain-HTTP target gets a context without certificates at all.

Keep-alive: an idle connection is dropped by the client before the server would drop it
(:data:`KEEPALIVE_EXPIRY_S`, or :func:`keepalive_expiry` of the server's own setting), so a
request is never written into a connection the server has closed in the meantime; the one race
left (see the comment at :data:`KEEPALIVE_EXPIRY_S`) is covered by the load generator's retry of
a request that never reached the server (:mod:`autotune.bench.stream`).
"""

from __future__ import annotations

import ssl

import httpx

from autotune.bench.netbackend import asyncio_transport

__all__ = [
    "KEEPALIVE_EXPIRY_S",
    "SERVER_KEEP_ALIVE_S",
    "ClientLanes",
    "keepalive_expiry",
    "make_client",
    "request_timeout",
    "stream_timeout",
]

# The engines' HTTP servers close a keep-alive connection after this many idle seconds: vLLM's
# OpenAI server runs uvicorn with timeout_keep_alive = VLLM_HTTP_TIMEOUT_KEEP_ALIVE (default 5),
# SGLang's runs uvicorn with its default timeout_keep_alive = 5.
SERVER_KEEP_ALIVE_S = 5.0
# The client drops an idle connection this long before the server's keep-alive runs out.
KEEPALIVE_MARGIN_S = 1.0
# So by default an idle connection lives at most 4 s on the client (httpx's default is 5 s, the
# same as the servers': a request sent at second 5 races the server's close and gets
# "Server disconnected without sending a response" or a broken pipe).
#
# When is the expiry checked? In httpcore 1.0.9 (``_async/connection_pool.py``,
# ``_assign_requests_to_connections``) every time a request enters the pool, i.e. when a
# connection is handed out: a connection is dropped there when ``has_expired()``, which is
# ``time.monotonic() > _expire_at`` (set to "response closed + keepalive_expiry" when the
# previous response was closed, ``_async/http11.py``) or, for an idle connection, "the socket is
# readable" (the server's FIN already arrived). So a client whose event loop stalled past the
# expiry gets a fresh connection when it wakes: the expiry is judged by the clock at
# acquisition, not by a background timer that a stalled loop would miss. Two races remain, both
# when the loop stalls: (1) the idle time is counted from when the client *processed* the end of
# the previous response, so a stall of more than the margin between the server's last write and
# the client's read of it lets the server's timer run out first; (2) a FIN that arrived during
# the stall is only seen once the loop polls the socket again, which can be after the request
# was written. Both end with no response byte, and :func:`~autotune.bench.stream.stream_request`
# sends such a request once more on a fresh connection.
KEEPALIVE_EXPIRY_S = SERVER_KEEP_ALIVE_S - KEEPALIVE_MARGIN_S


def keepalive_expiry(server_keep_alive_s: float | None = None) -> float:
    """The client's idle-connection expiry for a server whose keep-alive is ``server_keep_alive_s``.

    ``min(server − 1 s, KEEPALIVE_EXPIRY_S)``; for a server whose keep-alive is 2 s or less, half
    of it (a connection is still reused between back-to-back requests). None: the engines'
    default (:data:`SERVER_KEEP_ALIVE_S`).
    """
    if server_keep_alive_s is None:
        return KEEPALIVE_EXPIRY_S
    if not server_keep_alive_s > 0:
        raise ValueError(f"server_keep_alive_s must be > 0 (got {server_keep_alive_s})")
    margin = min(KEEPALIVE_MARGIN_S, server_keep_alive_s / 2)
    return min(server_keep_alive_s - margin, KEEPALIVE_EXPIRY_S)


def request_timeout(request_timeout_s: float) -> httpx.Timeout:
    """Per-operation limits; the total per-request deadline is enforced by the caller."""
    return httpx.Timeout(request_timeout_s, connect=30.0, pool=None)


def stream_timeout() -> httpx.Timeout:
    """Limits of a measured request: connect only. Its total deadline (``asyncio.timeout`` around
    the whole request) bounds every read, so a per-read timer would only cost time per token."""
    return httpx.Timeout(None, connect=30.0)


def make_client(
    request_timeout_s: float = 300.0,
    verify: ssl.SSLContext | bool = True,
    *,
    keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
) -> httpx.AsyncClient:
    """A client for the load generator: no connection cap, keep-alive, no proxy from the environment.

    An idle connection is dropped after ``keepalive_expiry_s`` (shorter than the server's
    keep-alive: :func:`keepalive_expiry`).

    ``trust_env=False`` because a proxy picked up from ``HTTP_PROXY`` would sit between the
    client and a local engine and silently add its own latency to every measurement. The
    transport reads and writes through :class:`~autotune.bench.netbackend.AsyncioBackend`.
    """
    return httpx.AsyncClient(
        transport=asyncio_transport(verify, keepalive_expiry_s),
        timeout=request_timeout(request_timeout_s),
        trust_env=False,
    )


class ClientLanes:
    """A free list of clients, one in-flight request each (see the module docstring).

    Args:
        request_timeout_s: Per-operation timeout of the clients it opens.
        shared: Use this one client for every request instead (tests pass a client with an
            ``httpx.MockTransport``); it is not closed here.
        tls: Whether the target is ``https``; plain HTTP skips loading CA certificates.
        keepalive_expiry_s: Idle-connection expiry of the clients it opens (see
            :func:`keepalive_expiry`).
    """

    def __init__(
        self,
        request_timeout_s: float = 300.0,
        shared: httpx.AsyncClient | None = None,
        tls: bool = True,
        keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
    ) -> None:
        self._timeout_s = request_timeout_s
        self.keepalive_expiry_s = keepalive_expiry_s
        self._shared = shared
        self._tls = tls
        self._free: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        self._ssl: ssl.SSLContext | None = None

    @property
    def opened(self) -> int:
        """How many lanes were opened (the peak number of requests in flight)."""
        return len(self._all)

    def acquire(self) -> httpx.AsyncClient:
        """A client with no request in flight; give it back with :meth:`release`."""
        if self._shared is not None:
            return self._shared
        if self._free:
            return self._free.pop()
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(verify=self._tls)
        client = make_client(self._timeout_s, verify=self._ssl, keepalive_expiry_s=self.keepalive_expiry_s)
        self._all.append(client)
        return client

    def release(self, client: httpx.AsyncClient) -> None:
        if client is not self._shared:
            self._free.append(client)

    async def aclose(self) -> None:
        """Close every lane this object opened (never the shared client)."""
        for client in self._all:
            await client.aclose()
        self._all.clear()
        self._free.clear()
