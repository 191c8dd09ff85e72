"""The routing lab: replay a trace through N replicas behind the routers engines use, and
measure hit ratio against load (sequence mode) and against TTFT (serving mode).

`policies.py` (the base classes and the simple routers), `sglang.py`, `vllm_kv.py`, `dynamo.py`,
`llmd.py` (the engines' routers), `registry.py` (every policy by name), `sequence.py` and
`serving.py` (the two modes), `bounds.py` (the pooled-Bélády and infinite-cache bounds beside every
result), `grid.py` (sweeps on a local process pool or Ray), `report.py`
(route_report.json / .md / .png), `cli.py` (`kvscope route`).
"""

from .policies import RouteRequest
from .registry import check_policies, make_policy, policy_names
from .sequence import run_sequence

__all__ = ["RouteRequest", "check_policies", "make_policy", "policy_names", "run_sequence"]
