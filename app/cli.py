"""`kvscope serve | replay | scenario | prefix | mirror | recording | demo | engines-env | sim-engines`."""

from __future__ import annotations

import argparse
import gc
import sys


def serve(argv: list[str], opening: bool = False) -> int:
    """`kvscope serve`, or with `opening`, `kvscope open FILE...` (the files served read-only)."""
    import dataclasses
    import secrets

    import uvicorn

    from .http_protocol import SERVER_OPTIONS, KVScopeH11Protocol
    from .main import create_app
    from .security import WILDCARD_BINDS, is_loopback_bind
    from .services import Startup
    from .settings import SettingsError, check_device, get_settings

    try:
        settings = get_settings()
    except SettingsError as exc:
        print(f"kvscope serve: {exc}", file=sys.stderr)
        return 2
    if opening:
        parser = argparse.ArgumentParser(prog="kvscope open", description=(
            "Serve recording files read-only, each as a pool named rec-<file name>, with the dashboard."))
        parser.add_argument("files", nargs="+", help="pool history recordings (.kvrec) made by `kvscope record` "
                            "or POST /api/pools/{pool}/recording (a mirror's KV-event recording, .kvevents, is "
                            "read by `kvscope recording`)")
    else:
        parser = argparse.ArgumentParser(prog="kvscope serve", description="Run the kvscope server.")
    parser.add_argument("--host", default=settings.host)
    parser.add_argument("--port", type=int, default=settings.port)
    parser.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N (default: KVSCOPE_DEVICE, auto)")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--no-token", action="store_true",
                        help="listen beyond loopback without a token (none is generated); not recommended")
    parser.add_argument("--publish", metavar="ENDPOINT",
                        help="the default pool caches prefixes and publishes its KV events here, "
                             "in vLLM's format (e.g. tcp://*:5557)")
    parser.add_argument("--publish-replay-endpoint", metavar="ENDPOINT", help="its replay socket (e.g. tcp://*:5558)")
    parser.add_argument("--publish-topic", default="", help="its topic")
    if not opening:
        from .cli_fleet import FILE_HELP

        parser.add_argument("--fleet", metavar="FILE.json", help="start with a fleet: " + FILE_HELP)
    args = parser.parse_args(argv)
    startup_fleets = []
    if getattr(args, "fleet", None):
        from .cli_fleet import load_fleet_file

        try:
            name, engines, options = load_fleet_file(args.fleet)
        except ValueError as exc:
            print(f"kvscope serve: --fleet {exc}", file=sys.stderr)
            return 2
        startup_fleets.append((name, engines, options))
    if args.publish is None and (args.publish_replay_endpoint or args.publish_topic):
        parser.error("--publish-replay-endpoint and --publish-topic need --publish")
    device = settings.device if args.device is None else args.device
    settings = dataclasses.replace(settings, host=args.host, port=args.port, device=device)
    if opening:
        from allocator.errors import KVScopeError
        from allocator.history.recording import read_recording

        for path in args.files:
            try:
                read_recording(path)
            except KVScopeError as exc:
                print(f"kvscope open: {exc}", file=sys.stderr)
                return 2
        settings = dataclasses.replace(settings, open_recordings=tuple(args.files))
    if settings.token is None and not args.no_token and not is_loopback_bind(args.host):
        # As Jupyter does: reachable from other machines means a token, printed once.
        settings = dataclasses.replace(settings, token=secrets.token_urlsafe(24))
        shown = "localhost" if args.host in WILDCARD_BINDS else args.host
        print(f"kvscope serve: listening on {args.host}:{args.port}, beyond loopback, so a token is "
              f"required (set KVSCOPE_TOKEN to choose it):\n    {settings.token}\n"
              f"    open http://{shown}:{args.port}/?token={settings.token}", file=sys.stderr, flush=True)
    # What would only fail in the startup hook (with a traceback) is checked here, in one line.
    try:
        check_device(device, "KVSCOPE_DEVICE" if args.device is None else "--device")
        settings.check_default_pool()
    except SettingsError as exc:
        print(f"kvscope serve: {exc}", file=sys.stderr)
        return 2
    startup = Startup(fleets=startup_fleets)
    if args.publish is not None:
        from .cli_events import default_publish_spec

        try:
            startup.pools = [(default_publish_spec(settings, args), {})]
        except ValueError as exc:
            print(f"kvscope serve: {exc}", file=sys.stderr)
            return 2
    app = create_app(settings, startup)
    KVScopeH11Protocol.head_timeout_s = settings.head_timeout_s
    # Everything imported so far (torch, numpy, FastAPI: hundreds of thousands of objects) lives
    # as long as the process; freezing it keeps the cyclic GC's full collections from rescanning
    # it every time allocations and events age into the old generation.
    gc.freeze()
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, **SERVER_OPTIONS)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = ("usage: kvscope {serve,open,record,replay,scenario,prefix,route,mirror,fleet,recording,demo,"
             "engines-env,sim-engines} [options]\n"
             "  serve      run the server: dashboard, REST API, stream, metrics (kvscope serve -h)\n"
             "  open       serve pool history recordings (.kvrec) read-only, scrubbable in the dashboard"
             " (kvscope open -h)\n"
             "  record     run a scenario or trace headless on one pool, recording it to a .kvrec (kvscope record -h)\n"
             "  replay     replay an LLM request trace through the serving simulator (kvscope replay -h)\n"
             "  scenario   run a fragmentation / chat / burst / prefix-chat scenario (kvscope scenario -h)\n"
             "  prefix     prefix-cache hit ratio vs capacity per policy on a Mooncake trace (kvscope prefix -h);\n"
             "             with --publish ENDPOINT, the trace as a live KV-event source"
             " (kvscope prefix --publish E -h)\n"
             "  route      routing policies over N replicas: hit ratio vs load vs TTFT (kvscope route -h)\n"
             "  mirror     the dashboard on a live vLLM/SGLang engine's prefix cache (kvscope mirror -h)\n"
             "  fleet      the dashboard on many engines at once: one prefix index, duplication, matches"
             " (kvscope fleet -h)\n"
             "  recording  summarise or play back a mirror's KV-event recording, .kvevents (kvscope recording -h)\n"
             "  demo       real vLLM CPU engines under a Mooncake trace, on the dashboard (kvscope demo -h)\n"
             "  engines-env  build the engine environment the demo runs vLLM from (kvscope engines-env -h)\n"
             "  sim-engines  simulated OpenAI engines, no GPU: prefix caches, /metrics, KV events"
             " (kvscope sim-engines -h)")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return serve(rest)
    if command == "open":
        return serve(rest, opening=True)
    if command == "record":
        from workloads.record import record_main

        return record_main(rest)
    if command == "prefix" and any(a == "--publish" or a.startswith("--publish=") for a in rest):
        from . import cli_events

        return int(cli_events.prefix_publish_main(rest))
    if command == "route" and any(a == "--router" or a.startswith("--router=") for a in rest):
        from .engines.router_run import router_main

        return int(router_main(rest))
    if command == "fleet":
        from .cli_fleet import fleet_main

        return int(fleet_main(rest))
    if command in ("mirror", "recording"):
        from . import cli_events

        return int((cli_events.mirror_main if command == "mirror" else cli_events.recording_main)(rest))
    if command == "demo":
        from .engines.demo import demo_main

        return int(demo_main(rest))
    if command == "sim-engines":
        from .engines.sim import main as sim_main

        return int(sim_main(rest))
    if command == "engines-env":
        from .engines.build_env import main as engines_env_main

        return int(engines_env_main(rest))
    if command in ("replay", "scenario", "prefix", "route"):
        from workloads import cli as workloads_cli  # imported only when used

        run = getattr(workloads_cli, f"{command}_main")
        return int(run(rest) or 0)
    print(f"unknown command {command!r}\n{usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
