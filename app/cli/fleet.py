"""`kvscope fleet ENDPOINT...` (the dashboard on many engines at once) and the `--fleet FILE`
of `kvscope serve`.

`kvscope serve` imports this module to build its parser (FILE_HELP), and `kvscope fleet -h`
answers without torch: what the commands need (the schemas, the fleet's sources, the server)
is imported inside the function using it.
"""

from __future__ import annotations

import argparse
import json
import os

from pydantic import ValidationError

FILE_HELP = ('a JSON file {"name": "demo", "engines": [{"name": "e0", "endpoint": "tcp://host:5557", '
             '"replay_endpoint"?, "topic"?, "metrics_url"?, "block_size"?, "dp_rank"?, "server"?}], '
             '"listen"?: {"endpoint": "tcp://127.0.0.1:5557", ...}}: the body of POST /api/fleets')


def load_fleet_file(path: str) -> tuple[str, list[dict], dict]:
    """A fleet file checked as the REST body is: its name, engines and the options of
    `Fleets.create` (`listen`, `max_engines`). Raises ValueError naming what to fix."""
    from ..schemas import FleetCreate  # lazy: torch-free CLI start

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
    p.add_argument("--namespace", help="with a nats:// URL: the Dynamo namespace to follow")
    p.add_argument("--component", help="with a nats:// URL: the Dynamo component to follow")
    p.add_argument("--nats-subject", help="with a nats:// URL: this subject instead of Dynamo's")
    p.add_argument("--nats-creds", metavar="FILE", help="a NATS creds file (else KVSCOPE_NATS_*)")
    p.add_argument("--nats-token-file", metavar="FILE", help="a file holding the NATS token")
    p.add_argument("--nats-user", help="the NATS user (its password: --nats-password-file)")
    p.add_argument("--nats-password-file", metavar="FILE", help="a file holding the NATS password")
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
        from kvevents.codec import WireError  # lazy: only --play reads a recording
        from kvevents.recording import read_records  # lazy: as above

        try:
            next(iter(read_records(args.play)), None)
        except (OSError, WireError) as exc:
            p.error(f"--play {args.play}: {exc}")
        return serve_with_fleet("kvscope fleet", args, args.name, [], None,
                                {"play": args.play, "speed": args.speed})
    listen = None
    if args.listen:
        from kvevents.listen import loopback_endpoint  # lazy: torch-free CLI start

        from ..schemas import ListenIn  # lazy: torch-free CLI start

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
    nats = None
    urls = [e for e in args.endpoints if e.startswith(("nats://", "tls://"))]
    if urls:
        if len(urls) > 1:
            p.error("give one nats:// URL (a NATS server carries every worker of the component)")
        args.endpoints = [e for e in args.endpoints if e not in urls]
        nats = _nats_options(p, args, urls[0])
    elif args.namespace or args.component:
        p.error("--namespace and --component go with a nats:// URL")
    if not args.endpoints and listen is None and nats is None:
        p.error("give at least one ENDPOINT (or a nats:// URL, --listen ENDPOINT, or --play FILE)")
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
    from ..schemas import FleetCreate  # lazy: torch-free CLI start

    try:
        FleetCreate.model_validate({"name": args.name, "engines": engines, "listen": listen,
                                    "nats": {k: v for k, v in (nats or {}).items() if k != "auth"}
                                    if nats else None})
    except ValidationError as exc:
        first = exc.errors()[0]
        p.error(f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}")
    options = {k: v for k, v in (("listen", listen), ("nats", nats)) if v}
    return serve_with_fleet("kvscope fleet", args, args.name, engines, args.record, options or None)


def _nats_options(p, args, url: str) -> dict:
    """`nats` for Fleets.create from the command line: the component, and credentials read
    from the files named (else the server's KVSCOPE_NATS_* settings apply)."""
    from kvevents.nats_source import NatsAuth, _read  # lazy: torch-free CLI start

    if not args.namespace or not args.component:
        p.error("a nats:// URL needs --namespace and --component (the Dynamo component's)")
    out = {"url": url, "namespace": args.namespace, "component": args.component,
           "subject": args.nats_subject, "block_size": args.block_size}
    try:
        auth = NatsAuth(token=_read(args.nats_token_file), user=args.nats_user,
                        password=_read(args.nats_password_file), creds_file=args.nats_creds)
    except ValueError as exc:
        p.error(str(exc))
    if args.nats_creds and not os.path.isfile(args.nats_creds):
        p.error(f"--nats-creds {args.nats_creds}: no such file")
    if auth.kind():
        out["auth"] = auth
    return out


def serve_with_fleet(prog: str, args, name: str, engines: list[dict], record: str | None,
                     options: dict | None = None) -> int:
    from .dashboard import serve_dashboard  # lazy: torch-free CLI start
    from ..services import Startup  # lazy: as above

    startup = Startup(fleets=[(name, engines, {"record": record, **(options or {})})])
    return serve_dashboard(prog, args, startup, f"?fleet={name}")
