"""The operator's resources for a number of sweeps: one rule, from the growth benchmark (docs/benchmarks.md).

The chart's default resources and the memory budget's floor for the operator's own share are this rule at
`SIZED_FOR_SWEEPS`; a test compares them, so they cannot drift apart. For more sweeps, set the chart's `resources` to
`memory_request_mib`, `memory_limit_mib` and `cpu_request_millicores` of that many.
"""

from __future__ import annotations

import math
from typing import Final

# From bench/operator_scale.py (docs/benchmarks.md, "Growth"), rounded up with headroom: the idle operator's RSS
# (124 MiB: started, watching, one sweep) and its peak RSS per 1,000 sweeps above it (at most 76 MiB measured: every
# sweep applied at once, then all running with progress written every minute; 96 is a quarter more); its CPU idle
# (0.25m measured) and per 1,000 running sweeps in the steady state (6.0 ms per sweep-minute at 1,000 sweeps, 100m:
# ms per sweep-minute x 1,000 / 60,000 ms per core-minute; 150m leaves room for GPU sweeps' pod reads).
IDLE_MIB: Final = 128
MIB_PER_1000_SWEEPS: Final = 96
IDLE_MILLICORES: Final = 5
MILLICORES_PER_1000_SWEEPS: Final = 150
# What tenants' data may hold at once beside the operator's own working set (the memory budget: the verifications
# and the status and result documents read at once, docs/guard.md).
TENANT_MIB: Final = 256
# The chart's default: the size the bench's goals are set at.
SIZED_FOR_SWEEPS: Final = 1000


def _up(value: float, step: int) -> int:
    return int(math.ceil(value / step) * step)


def own_mib(sweeps: int) -> int:
    """The operator's own working set for `sweeps` sweeps (MiB, rounded up to 64): the idle process and each
    sweep's share (its cached copies, RayJob, pods, rhythms)."""
    return _up(IDLE_MIB + MIB_PER_1000_SWEEPS * sweeps / 1000, 64)


def memory_request_mib(sweeps: int) -> int:
    """The memory request: what the operator holds running `sweeps` sweeps."""
    return own_mib(sweeps)


def memory_limit_mib(sweeps: int) -> int:
    """The memory limit: its own working set and the memory budget for tenants' data beside it."""
    return own_mib(sweeps) + TENANT_MIB


def cpu_request_millicores(sweeps: int) -> int:
    """The CPU request (rounded up to 50m): the steady CPU of `sweeps` running sweeps. A burst of admissions uses
    more for a while; with no CPU limit (the chart sets none) it takes what the node has free."""
    return _up(IDLE_MILLICORES + MILLICORES_PER_1000_SWEEPS * sweeps / 1000, 50)
