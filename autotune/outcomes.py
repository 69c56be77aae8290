"""The trial-outcome taxonomy shared by every part of autotune (see DESIGN.md).

A trial ends in exactly one outcome. Only ``ok`` and ``slo_violation`` carry measurements the
sampler may rank; every other outcome is an infeasible or failed point and must never look good
to the optimiser.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["SERVED", "Outcome"]


class Outcome(StrEnum):
    OK = "ok"
    SLO_VIOLATION = "slo_violation"
    OOM_STARTUP = "oom_startup"
    KV_INSUFFICIENT = "kv_insufficient"
    OOM_RUNTIME = "oom_runtime"
    INVALID_FLAGS = "invalid_flags"
    STARTUP_TIMEOUT = "startup_timeout"
    CRASH = "crash"
    # The load generator, not the engine, limited every run (starved of CPU, or requests lost
    # on the client's side): the engine was not measured. Retried; never a score.
    CLIENT_LIMITED = "client_limited"
    # Other processes (or the hypervisor) took the engine's cores in every run: the host was
    # measured, not the flags. Retried; never a score.
    HOST_DISTURBED = "host_disturbed"

    @property
    def served(self) -> bool:
        """True when the engine served the workload, so the trial has real measurements."""
        return self in (Outcome.OK, Outcome.SLO_VIOLATION)

    @property
    def retryable(self) -> bool:
        """Infrastructure-looking failures are retried once; flag-caused ones never are."""
        return self in (Outcome.STARTUP_TIMEOUT, Outcome.CRASH, Outcome.CLIENT_LIMITED, Outcome.HOST_DISTURBED)

    @property
    def memory_related(self) -> bool:
        return self in (Outcome.OOM_STARTUP, Outcome.KV_INSUFFICIENT, Outcome.OOM_RUNTIME)


#: The outcomes whose trials carry measurements, as stored (a record's outcome is its string).
SERVED = frozenset(o.value for o in Outcome if o.served)
