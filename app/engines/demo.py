"""`kvscope demo`: N real vLLM CPU engines, a Mooncake trace replayed against them, and the
dashboard on their prefix caches, from one command.

The dashboard starts at once; the engines boot beside it (about two minutes on two cores), each
in a process group of its own, and progress is printed until all answer `/health`. Each engine
hashes with its own seed (PYTHONHASHSEED), so the same tokens are different blocks on each, as in
a fleet of independently started engines. Ctrl-C or SIGTERM stops the load, the dashboard and
every engine group; an engine that dies while booting (or a port that is taken) stops the demo,
naming the engine and showing the tail of its log.

Ports: the dashboard on --port P; engine i serves HTTP on P+101+3i, its KV events on P+102+3i
and their replay on P+103+3i. Every one of them is probed (bound and let go) before any engine
starts: a taken one stops the demo, naming the engine and the port, and nothing is started.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import env
from .server import BLOCK_SIZE, EngineFailed, EngineProcess, EngineSpec, port_taken

PROG = "kvscope demo"
ENGINE_BLOCKS = 1024  # per engine: 32,768 tokens; the trace fills it in about a minute, then evicts
MAX_MODEL_LEN = 2048
MAX_ENGINES = 4
MAX_SIM_ENGINES = 16
# A simulated engine plays the CPU engines' shape: 32-token blocks (one 512-token trace block,
# scaled by 1/16 as the load generator scales prompts), so each of its tokens is 16 model tokens
# for the costs.
SIM_TOKEN_SCALE = 16
ROUTER_BLOCK = 512  # behind a real router: the trace's own blocks, one character per token
ROUTER_MAX_PROMPT = 16_384  # tokens of a prompt the demo sends a router (32 blocks)
FLEET = "demo"  # the fleet of all the demo's engines, the page the demo sends the user to


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside the block SIGTERM raises KeyboardInterrupt, so it stops the demo as Ctrl-C does;
    `shield()` first thing in the cleanup keeps a second signal from cutting it short. Leaving
    the block puts SIGTERM's handler back."""
    def interrupted(signum, _frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def shield() -> None:
    """Ignore Ctrl-C and SIGTERM from here on (the demo's cleanup, before it exits)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def engine_specs(n: int, port: int, log_dir: Path) -> list[EngineSpec]:
    return [EngineSpec(f"engine-{i}", port + 101 + 3 * i, port + 102 + 3 * i, port + 103 + 3 * i,
                       num_blocks=ENGINE_BLOCKS, max_model_len=MAX_MODEL_LEN,
                       hash_seed=str(1000 + i), log_path=log_dir / f"engine-{i}.log")
            for i in range(n)]


def taken_ports(specs: list[EngineSpec]) -> list[str]:
    """One line per engine with a port that cannot be bound now ("engine engine-1: events port
    8206 already in use"), or past 65535; empty when all are free."""
    out = []
    for s in specs:
        bad = [f"{what} port {p} is past 65535" if p > 65535 else f"{what} port {p} already in use"
               for what, p in s.ports().items() if p > 65535 or port_taken(p)]
        if bad:
            out.append(str(EngineFailed(s.name, ", ".join(bad))))
    return out


def startup_for(specs: list[EngineSpec]):
    """How the engines appear on the dashboard (the one place that decides it): one mirror pool
    per engine, named after it, following its KV events and polling its /metrics; and the fleet
    `FLEET` of all of them, which the link the demo prints (`fleet_link`) opens."""
    return startup_for_rows([{"name": s.name, "endpoint": s.events_endpoint,
                         "replay_endpoint": s.replay_endpoint, "metrics_url": s.metrics_url,
                         "num_blocks": s.num_blocks, "block_size": BLOCK_SIZE} for s in specs])


def startup_for_rows(rows: list[dict]):
    """`startup_for` engines given as fleet-file rows (name, endpoint, replay_endpoint,
    metrics_url, num_blocks, block_size): the simulated engines' are only known once bound.
    Returns an app.services.Startup."""
    from ..services import Startup  # the server's modules (torch among them) load only to serve

    return Startup(pools=[
        ({"name": r["name"], "strategy": "mirror", "num_blocks": r["num_blocks"],
          "mirror": {"endpoint": r["endpoint"], "replay_endpoint": r["replay_endpoint"],
                     "metrics_url": r["metrics_url"]}}, {})
        for r in rows], fleets=[(FLEET, [dict(r) for r in rows], {})])


def fleet_link(host: str, port: int, names: list[str]) -> str:
    """The line that sends the user to the fleet view of all the engines, and names the
    per-engine mirror pools (each engine's own block map and /metrics on the dashboard)."""
    base = f"http://{host}:{port}/"
    return (f"fleet view at {base}?fleet={FLEET}#fleet (one mirror pool per engine: "
            f"{', '.join(f'{base}?pool={n}' for n in names)})")


class Supervisor:
    """Boots the engines, reports progress, and watches them; `failure` is set (and `on_fail`
    called) when one dies."""

    def __init__(self, engines: list[EngineProcess], on_fail, out=sys.stdout) -> None:
        self.engines, self.on_fail, self.out = engines, on_fail, out
        self.load = None  # the load generator, once started: its progress is reported too
        self.failure: EngineFailed | None = None
        self.ready: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="demo-supervisor")

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def ready_urls(self) -> list[str]:
        return [e.spec.url for e in self.engines if e.spec.name in self.ready]

    def _say(self, text: str) -> None:
        print(f"{PROG}: {text}", file=self.out, flush=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        last_report = 0.0
        while not self._stop.is_set():
            for e in self.engines:
                if not e.alive():
                    phase = "running" if e.spec.name in self.ready else "booting"
                    self.failure = EngineFailed(
                        e.spec.name, f"exited with code {e.proc.returncode} while {phase}",
                        e.log_tail())
                    self.on_fail()
                    return
                if e.spec.name not in self.ready and e.healthy():
                    self.ready.add(e.spec.name)
                    self._say(f"{e.spec.name} is up after {time.monotonic() - t0:.0f} s "
                              f"({e.spec.url})")
            waiting = [e.spec.name for e in self.engines if e.spec.name not in self.ready]
            now = time.monotonic()
            if waiting and now - last_report >= 10:
                last_report = now
                self._say(f"booting {', '.join(waiting)}: {now - t0:.0f} s "
                          f"({len(self.ready)}/{len(self.engines)} up; about 2 minutes on 2 cores)")
            elif not waiting and self.load is not None and now - last_report >= 30:
                last_report = now
                self._say(f"load: {self.load.status()}")
            self._stop.wait(1.0)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=(
        "Start N real vLLM CPU engines (tiny model, random weights), replay the Mooncake "
        "conversation trace against them, and serve the dashboard on their prefix caches."))
    p.add_argument("--engines", type=int, default=2, help=f"engines to start, 1..{MAX_ENGINES} (default 2)")
    p.add_argument("--sim", type=int, default=None, metavar="N", help=(
        f"N simulated engines instead (1..{MAX_SIM_ENGINES}; no vLLM, no GPU, up in seconds: "
        "each a real prefix-caching pool under the serving simulator's costs, see kvscope "
        "sim-engines)"))
    p.add_argument("--port", type=int, default=None, help="the dashboard's port (default: KVSCOPE_PORT, 8000); "
                   "engine i takes P+101+3i .. P+103+3i")
    p.add_argument("--host", default="127.0.0.1", help="the dashboard's address (default 127.0.0.1)")
    p.add_argument("--trace", default=None, help="a Mooncake JSONL trace (default: the bundled conversation trace)")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed, times real time (default 1)")
    p.add_argument("--log-dir", default=None, help="where the engines' logs go (default: a new temp folder)")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--router", default=None, help=(
        "with --sim: the real router in front of the engines, sglang or vllm (cache_aware) or "
        "vllm-kv (vllm-router's kv_aware on the engines' KV events), from "
        "kvscope[routers]; the load goes to it as text prompts (default: round robin here)"))
    args = p.parse_args(argv)
    if args.router is not None and args.sim is None:
        p.error("--router needs --sim (the vLLM demo's engines are fed round robin)")
    if args.sim is not None and not 1 <= args.sim <= MAX_SIM_ENGINES:
        p.error(f"--sim must be 1..{MAX_SIM_ENGINES}")
    if not 1 <= args.engines <= MAX_ENGINES:
        p.error(f"--engines must be 1..{MAX_ENGINES} (each engine takes about 2 GB of memory)")
    if args.port is not None and not 1 <= args.port <= 65535:
        p.error("--port must be 1..65535")
    if not args.speed > 0:
        p.error("--speed must be a positive number")
    return args


def demo_main(argv: list[str]) -> int:
    args = parse(argv)
    why = None if args.sim else env.missing()
    if why:
        print(f"{PROG}: {why}", file=sys.stderr)
        return 2
    from allocator.errors import KVScopeError  # lazy: `kvscope demo --help` imports no torch
    from workloads.mooncake import load_mooncake  # lazy: `kvscope demo --help` imports no torch

    from ..settings import SettingsError, get_settings  # lazy: `kvscope demo --help` imports no torch

    try:
        settings = get_settings()
        trace = load_mooncake(args.trace)
    except (SettingsError, KVScopeError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    port = args.port or settings.port
    if port_taken(port):
        print(f"{PROG}: the dashboard's port {port} is already in use (choose another with --port)",
              file=sys.stderr)
        return 2
    settings = dataclasses.replace(settings, host=args.host, port=port)
    if args.sim:
        return run_sim(args, settings, trace)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="kvscope-demo-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    specs = engine_specs(args.engines, port, log_dir)
    taken = taken_ports(specs)
    if taken:
        for line in taken:
            print(f"{PROG}: {line}", file=sys.stderr)
        print(f"{PROG}: engine i takes ports P+101+3i .. P+103+3i of --port P; choose another "
              "--port (nothing was started)", file=sys.stderr)
        return 1
    engines = [EngineProcess(s, log_dir) for s in specs]
    return run(args, settings, trace, engines, log_dir)


def run_sim(args, settings, trace) -> int:
    """The demo on `args.sim` simulated engines in this process (app/engines/sim.py), behind
    `args.router` (a real router) when given."""
    with sigterm_as_interrupt():
        return _serve_sim(args, settings, trace)


def _serve_sim(args, settings, trace) -> int:
    import uvicorn

    from allocator.errors import KVScopeError  # lazy: `kvscope demo --help` imports no torch
    from workloads.routing.real_router import RouterError  # lazy: `kvscope demo --help` imports no torch
    from workloads.routing.serving import ServingCosts  # lazy: `kvscope demo --help` imports no torch

    from ..main import create_app  # lazy: `kvscope demo --help` imports no torch
    from .load import LoadGenerator  # lazy: `kvscope demo --help` imports no torch
    from .sim import SimEngines, fleet_file  # lazy: `kvscope demo --help` imports no torch

    engines = load = router = None
    try:
        if args.router:
            from ..routing_router import check_router  # lazy: `kvscope demo --help` imports no torch

            check_router(args.router)  # unknown or not installed: one line, nothing started
        if args.router:
            # behind a real router: the lab's text prompts, 512-token blocks of one character
            # per token, as `kvscope route --router` sends them; every decision logged at the
            # engines, and the run listed in the Routing view
            from workloads.routing.decisions import DecisionLog

            from .router_run import RouterSession  # lazy: `kvscope demo --help` imports no torch

            configs = SimEngines.uniform(args.sim, prefix="engine", num_blocks=ENGINE_BLOCKS,
                                         block_size=ROUTER_BLOCK, tokenizer="chars",
                                         max_model_len=ROUTER_MAX_PROMPT + 512)
            decisions = DecisionLog(f"router:{args.router}", args.sim, ENGINE_BLOCKS * ROUTER_BLOCK)
            router = RouterSession(args.router, configs, decisions=decisions, events=True).start()
            engines = router.engines
            print(f"{PROG}: the real {args.router} router at {router.url} in front of them",
                  flush=True)
        else:
            # each engine token stands for SIM_TOKEN_SCALE model tokens: linear costs
            configs = SimEngines.uniform(args.sim, prefix="engine", num_blocks=ENGINE_BLOCKS,
                                         block_size=BLOCK_SIZE, token_scale=SIM_TOKEN_SCALE,
                                         costs=ServingCosts(model="linear"),
                                         max_model_len=MAX_MODEL_LEN)
            engines = SimEngines(configs).start()
        rows = fleet_file(engines, FLEET)["engines"]
        for row, url in zip(rows, engines.urls):
            print(f"{PROG}: {row['name']} (simulated) at {url}, KV events {row['endpoint']}",
                  flush=True)
        targets = (lambda: [router.url]) if router is not None else (lambda: engines.urls)
        load = LoadGenerator(trace, targets, speed=args.speed, engines=args.sim, per_engine=16,
                             text=router is not None,
                             max_prompt=ROUTER_MAX_PROMPT if router is not None else 2000).start()
        startup = startup_for_rows(rows)
        if router is not None:  # listed in the Routing view while the demo serves
            startup.router_runs.append((router, {
                "router": args.router, "replicas": args.sim,
                "capacity_tokens": ENGINE_BLOCKS * ROUTER_BLOCK, "limit": len(trace),
                "speed": args.speed}, FLEET, load))
        app = create_app(settings, startup)
        server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port,
                                               log_level=args.log_level,
                                               ws_per_message_deflate=False))
        print(f"{PROG}: {fleet_link(settings.host, settings.port, [c.name for c in configs])}; "
              "Ctrl-C stops everything", flush=True)
        server.run()
        return 0
    except KeyboardInterrupt:
        return 130
    except (KVScopeError, RouterError) as exc:  # an unknown / missing router, or one that failed
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, KVScopeError) else 1
    finally:
        shield()
        if load is not None:
            load.stop()
            print(f"{PROG}: load: {load.status()}", flush=True)
        if router is not None:  # the router and its engines
            router.close()
            print(f"{PROG}: stopped the {args.router} router and {args.sim} simulated engine(s)",
                  flush=True)
        elif engines is not None:
            engines.stop()
            print(f"{PROG}: stopped {args.sim} simulated engine(s)", flush=True)


def run(args, settings, trace, engines: list[EngineProcess], log_dir: Path) -> int:
    """The demo on `engines` (real vLLM processes): started, watched, stopped with it."""
    with sigterm_as_interrupt():
        return _serve(args, settings, trace, engines, log_dir)


def _serve(args, settings, trace, engines: list[EngineProcess], log_dir: Path) -> int:
    import uvicorn

    from ..main import create_app  # lazy: `kvscope demo --help` imports no torch
    from .load import LoadGenerator  # lazy: `kvscope demo --help` imports no torch

    server = load = supervisor = None
    try:
        for e in engines:
            e.start()
            print(f"{PROG}: {e.spec.name} started (pid {e.pid}, log {e.log_path})", flush=True)
        app = create_app(settings, startup_for([e.spec for e in engines]))
        server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port,
                                               log_level=args.log_level,
                                               ws_per_message_deflate=False))

        def fail() -> None:
            server.should_exit = True
        supervisor = Supervisor(engines, fail).start()
        load = supervisor.load = LoadGenerator(trace, supervisor.ready_urls, speed=args.speed,
                                               engines=len(engines)).start()
        print(f"{PROG}: {fleet_link(settings.host, settings.port, [e.spec.name for e in engines])}; "
              "Ctrl-C stops everything", flush=True)
        server.run()
        if supervisor.failure is not None:
            print(f"{PROG}: {supervisor.failure}", file=sys.stderr)
            return 1
        return 0
    except EngineFailed as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        shield()  # a second Ctrl-C must not cut the cleanup
        if load is not None:
            load.stop()
            print(f"{PROG}: load: {load.status()}", flush=True)
        if supervisor is not None:
            supervisor.stop()
        for e in engines:
            e.stop(grace=5)
        print(f"{PROG}: stopped {len(engines)} engine(s); logs in {log_dir}", flush=True)
