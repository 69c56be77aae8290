"""Reset an engine's prefix cache before a run, where the engine allows it.

Without a reset, a repeated run against the same engine finds the previous run's prompts cached
(vLLM's benchmark docs warn about same-seed reruns), and its TTFT is no longer comparable.

* vLLM: ``POST /reset_prefix_cache``, served only with ``VLLM_SERVER_DEV_MODE=1`` (what
  ``vllm bench sweep`` calls between runs); it answers ``{"success": false}`` while blocks are
  still held by running requests;
* SGLang: ``POST /flush_cache`` (refused with 400 while requests are running).

Both are tried in turn; a 404/405 means "not this engine, or not enabled". The load generator
also salts prompt content per run, so an engine without a reset route still sees fresh prompts.
"""

from __future__ import annotations

import httpx

__all__ = ["RESET_ROUTES", "reset_prefix_cache"]

RESET_ROUTES = ("/reset_prefix_cache", "/flush_cache")


async def reset_prefix_cache(client: httpx.AsyncClient, base_url: str, headers: dict[str, str]) -> str:
    """Ask the engine to drop its prefix cache.

    Args:
        client: An HTTP client.
        base_url: Server root.
        headers: Sent with the request (``Authorization``).

    Returns:
        The route that reset the cache, ``"unsupported"`` when no route exists (or is enabled),
        or ``"failed: <why>"``. Never raises: a run without a reset is still a valid run.
    """
    for route in RESET_ROUTES:
        try:
            resp = await client.post(base_url + route, headers=headers)
        except httpx.HTTPError as err:
            return f"failed: {type(err).__name__}"
        if resp.status_code in (404, 405):
            continue
        if resp.status_code == 200:
            return route if _succeeded(resp) else f"failed: {route} refused (blocks still in use)"
        return f"failed: {route} answered {resp.status_code}"
    return "unsupported"


def _succeeded(resp: httpx.Response) -> bool:
    try:
        data = resp.json()
    except ValueError:  # SGLang answers plain text
        return True
    return not (isinstance(data, dict) and data.get("success") is False)
