"""`kvscope serve` (the server) and `kvscope open FILE...` (recording files served read-only)."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import secrets
import sys

import uvicorn
from pydantic import ValidationError

from allocator import PoolSpec
from allocator.errors import KVScopeError
from allocator.history.recording import read_recording

from ..http.protocol import SERVER_OPTIONS, KVScopeH11Protocol
from ..http.security import WILDCARD_BINDS, is_loopback_bind
from ..main import create_app, default_pool_spec
from ..schemas import PublishSpec
from ..services import Startup
from ..settings import SettingsError, check_device, get_settings
from .args import FILE_HELP
from .fleet import load_fleet_file


def serve_main(argv: list[str]) -> int:
    return serve(argv)


def open_main(argv: list[str]) -> int:
    return serve(argv, opening=True)


def serve(argv: list[str], opening: bool = False) -> int:
    """`kvscope serve`, or with `opening`, `kvscope open FILE...` (the files served read-only)."""
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
        parser.add_argument("--fleet", metavar="FILE.json", help="start with a fleet: " + FILE_HELP)
    args = parser.parse_args(argv)
    startup_fleets = []
    if getattr(args, "fleet", None):
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


def default_publish_spec(settings, args) -> dict:
    """The `default` pool of `kvscope serve --publish`: paged with prefix caching (LRU, 16-token
    blocks), publishing its stored / removed / cleared events. Raises ValueError (one line)."""
    if "prefix_caching" not in inspect.signature(PoolSpec.parse).parameters:
        raise ValueError("--publish needs the allocator's prefix caching, which this build lacks")
    spec = default_pool_spec(settings)
    spec.pop("cache", None)
    spec.update(prefix_caching={"policy": "lru"}, tokens_per_block=16,
                publish={"endpoint": args.publish, "topic": args.publish_topic,
                         "replay_endpoint": args.publish_replay_endpoint})
    spec["publish"] = {k: v for k, v in spec["publish"].items() if v is not None}
    try:
        PublishSpec.model_validate(spec["publish"])
    except ValidationError as exc:
        e = exc.errors()[0]
        raise ValueError(f"--publish: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    return spec
