"""`kvscope fleet ENDPOINT...` (the dashboard on many engines at once; its arguments:
app/cli/args.py) and the `--fleet FILE` of `kvscope serve`."""

from __future__ import annotations

import argparse
import json
import os

from pydantic import ValidationError

from kvevents.codec import WireError
from kvevents.listen import loopback_endpoint
from kvevents.nats_source import NatsAuth, _read
from kvevents.recording import read_records

from ..schemas import FleetCreate, ListenIn
from ..services import Startup
from .dashboard import serve_dashboard


def load_fleet_file(path: str) -> tuple[str, list[dict], dict]:
    """A fleet file checked as the REST body is: its name, engines and the options of
    `Fleets.create` (`listen`, `max_engines`). Raises ValueError naming what to fix."""
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


def run_fleet(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    if args.play:
        if args.endpoints or args.record:
            p.error("--play takes no ENDPOINT and no --record")
        if args.speed is not None and args.speed <= 0:
            p.error("--speed must be positive")

        try:
            next(iter(read_records(args.play)), None)
        except (OSError, WireError) as exc:
            p.error(f"--play {args.play}: {exc}")
        return serve_with_fleet("kvscope fleet", args, args.name, [], None,
                                {"play": args.play, "speed": args.speed})
    listen = None
    if args.listen:
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
    startup = Startup(fleets=[(name, engines, {"record": record, **(options or {})})])
    return serve_dashboard(prog, args, startup, f"?fleet={name}")
