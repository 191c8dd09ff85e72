"""kvscope workloads: scenarios, trace replay through a serving simulator, reports, policy study.

Depends only on `allocator/` (never on `app/`). The server's entry point is
`workloads.live.build_live_workload`; the command line is `workloads.cli` (`python -m workloads`).
"""

from .live import LiveWorkload, build_live_workload
from .scenarios import SCENARIOS, run_scenario
from .simulator import RESERVATIONS, SimConfig, Simulator, simulate
from .trace import ATTRIBUTION, DEFAULT_TRACE, Trace, load_trace

__all__ = [
    "ATTRIBUTION", "DEFAULT_TRACE", "LiveWorkload", "RESERVATIONS", "SCENARIOS", "SimConfig",
    "Simulator", "Trace", "build_live_workload", "load_trace", "run_scenario", "simulate",
]
