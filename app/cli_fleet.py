"""`kvscope fleet ENDPOINT...` (the dashboard on many engines at once) and the `--fleet FILE`
of `kvscope serve`."""

from __future__ import annotations

import argparse
import json

from pydantic import ValidationError

FILE_HELP = ('a JSON file {"name": "demo", "engines": [{"name": "e0", "endpoint": "tcp://host:5557", '
             '"replay_endpoint"?, "topic"?, "metrics_url"?, "block_size"?, "dp_rank"?, "server"?}], '
             '"listen"?: {"endpoint": "tcp://127.0.0.1:5557", ...}}: the body of POST /api/fleets')


def load_fleet_file(path: str) -> tuple[str, list[dict], dict]:
    """A fleet file checked as the REST body is: its name, engines and the options of
    `Fleets.create` (`listen`, `max_engines`). Raises ValueError naming what to fix."""
    from .routes.fleets import FleetCreate

    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        body = FleetCreate.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ValueError(f"{path}: {where}: {first['msg']}") from None
    options = {}
    if body.listen is not None:
        options["listen"] = body.listen.model_dump()
    if body.max_engines is not None:
        options["max_engines"] = body.max_engines
    return body.name, [e.model_dump() for e in body.engines], options


def fleet_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="kvscope fleet",
        description="Serve the dashboard on many vLLM / SGLang engines at once: one prefix index "
                    "across them (blocks keyed by their tokens), duplication and missed reuse, "
                    "matches. Engines are named e0, e1, ... in the order given.")
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT",
                   help="each engine's PUB endpoint as seen from here, e.g. tcp://gpu-0:5557")
    p.add_argument("--listen", metavar="ENDPOINT",
                   help="bind ENDPOINT for engines to connect to, as llm-d's indexer does (vLLM "
                        "with --kv-events-config endpoint tcp://<this host>:5557, topic "
                        "kv@<pod>@<model>): each topic is an engine named by its pod. A bare port "
                        "(5557) binds loopback; name the interface to bind beyond it "
                        "(tcp://0.0.0.0:5557): any host reaching it can then publish")
    p.add_argument("--listen-topic", default="kv@", help="with --listen: the topic prefix taken "
                   "(default: kv@)")
    p.add_argument("--pod-replay-endpoint", metavar="TEMPLATE",
                   help="with --listen: each pod's replay endpoint, {pod} standing for its name "
                        "(e.g. tcp://{pod}.vllm:5558)")
    p.add_argument("--name", default="fleet", help="the fleet's name (default: fleet)")
    p.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                   help="an engine's /metrics, once per engine in the same order (optional)")
    p.add_argument("--replay-endpoint", action="append", default=[], metavar="ENDPOINT",
                   help="an engine's replay endpoint, once per engine in the same order (optional)")
    p.add_argument("--topic", default="", help="the engines' topic (default: all)")
    p.add_argument("--wire", choices=("vllm", "dynamo"), default="vllm",
                   help="what the endpoints speak: vllm (vLLM's and SGLang's publishers, the "
                        "default) or dynamo (Dynamo workers' ZeroMQ event plane; give "
                        "--block-size, the workers' kv block size)")
    p.add_argument("--block-size", type=int, default=None,
                   help="tokens per block the engines were started with (checked against their events)")
    p.add_argument("--record", metavar="FILE", help="record every engine's batches, tagged with "
                   "the engine, to FILE (.kvevents)")
    p.add_argument("--play", metavar="FILE", help="instead of live engines, play a fleet recording "
                   "(made with --record) into the fleet")
    p.add_argument("--speed", type=float, default=None,
                   help="with --play: times real time (default: as fast as it goes)")
    p.add_argument("--host", default=None, help="listen address (default: KVSCOPE_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: KVSCOPE_PORT, 8000)")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    if args.play:
        if args.endpoints or args.record:
            p.error("--play takes no ENDPOINT and no --record")
        if args.speed is not None and args.speed <= 0:
            p.error("--speed must be positive")
        from kvevents.codec import WireError
        from kvevents.recording import read_records

        try:
            next(iter(read_records(args.play)), None)
        except (OSError, WireError) as exc:
            p.error(f"--play {args.play}: {exc}")
        return serve_with_fleet("kvscope fleet", args, args.name, [], None,
                                {"play": args.play, "speed": args.speed})
    listen = None
    if args.listen:
        from kvevents.listen import loopback_endpoint

        from .routes.fleets import ListenIn

        try:
            listen = ListenIn.model_validate({
                "endpoint": loopback_endpoint(args.listen), "topic": args.listen_topic,
                "replay_endpoint": args.pod_replay_endpoint, "block_size": args.block_size,
            }).model_dump()
        except ValidationError as exc:
            first = exc.errors()[0]
            p.error(f"--listen: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}")
    elif args.pod_replay_endpoint:
        p.error("--pod-replay-endpoint needs --listen")
    if not args.endpoints and listen is None:
        p.error("give at least one ENDPOINT (or --listen ENDPOINT, or --play FILE)")
    for opt, given in (("--metrics-url", args.metrics_url), ("--replay-endpoint", args.replay_endpoint)):
        if given and len(given) != len(args.endpoints):
            p.error(f"give {opt} once per endpoint ({len(args.endpoints)}), or not at all")
    engines = []
    for i, ep in enumerate(args.endpoints):
        e = {"name": f"e{i}", "endpoint": ep, "topic": args.topic}
        if args.metrics_url:
            e["metrics_url"] = args.metrics_url[i]
        if args.replay_endpoint:
            e["replay_endpoint"] = args.replay_endpoint[i]
        if args.block_size:
            e["block_size"] = args.block_size
        if args.wire != "vllm":
            e["wire"] = args.wire
        engines.append(e)
    from .routes.fleets import FleetCreate

    try:
        FleetCreate.model_validate({"name": args.name, "engines": engines, "listen": listen})
    except ValidationError as exc:
        first = exc.errors()[0]
        p.error(f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}")
    return serve_with_fleet("kvscope fleet", args, args.name, engines, args.record,
                            {"listen": listen} if listen else None)


def serve_with_fleet(prog: str, args, name: str, engines: list[dict], record: str | None,
                     options: dict | None = None) -> int:
    from .cli_events import serve_dashboard

    def setup(app) -> str:
        app.state.startup_fleets = [(name, engines, {"record": record, **(options or {})})]
        return f"?fleet={name}"

    return serve_dashboard(prog, args, setup)
