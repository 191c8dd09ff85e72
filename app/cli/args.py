"""The arguments of the `kvscope` subcommands of this package that parse before they load
anything: `kvscope mirror | recording | fleet | prefix --publish` (app/cli/__init__.py builds
each parser from here, and imports the module that runs the command once its arguments parsed,
so `kvscope fleet -h` or a mistyped flag answers without torch or the server)."""

from __future__ import annotations

import argparse

from kvevents.recording import HISTORY_SUFFIX, SUFFIX

FILE_HELP = ('a JSON file {"name": "demo", "engines": [{"name": "e0", "endpoint": "tcp://host:5557", '
             '"replay_endpoint"?, "topic"?, "metrics_url"?, "block_size"?, "dp_rank"?, "server"?}], '
             '"listen"?: {"endpoint": "tcp://127.0.0.1:5557", ...}}: the body of POST /api/fleets')


def server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=None, help="listen address (default: KVSCOPE_HOST, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: KVSCOPE_PORT, 8000)")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--name", default=None, help="the pool's name on the page")


def mirror(p: argparse.ArgumentParser) -> None:
    p.description = ("Serve the dashboard on a live vLLM / SGLang engine's prefix cache, followed "
                     "through its KV events (the engine's --kv-events-config endpoints).")
    p.add_argument("endpoint", help="the engine's PUB endpoint as seen from here, e.g. tcp://gpu-node:5557")
    p.add_argument("--replay-endpoint", help="the engine's replay (ROUTER) endpoint, e.g. tcp://gpu-node:5558")
    p.add_argument("--topic", default="", help="the engine's topic (default: all)")
    p.add_argument("--num-blocks", type=int, help="the engine's KV block count (else from --metrics-url)")
    p.add_argument("--metrics-url", help="the engine's /metrics (num_gpu_blocks, KV usage, hit ratio)")
    p.add_argument("--record", metavar="FILE", help="also record every batch applied to FILE, a KV-event "
                   "recording (name it .kvevents; .kvrec is the pool history recordings' suffix)")
    server_args(p)


def prefix_publish(p: argparse.ArgumentParser) -> None:
    p.description = ("Replay a Mooncake trace on a prefix-caching pool as a live KV-event source "
                     "(vLLM's wire format), for testing KV-aware routers without a GPU.")
    p.add_argument("--trace", default=None, help="Mooncake JSONL trace (default: the bundled one)")
    p.add_argument("--publish", required=True, metavar="ENDPOINT", help="PUB endpoint, e.g. tcp://*:5557")
    p.add_argument("--publish-replay-endpoint", metavar="ENDPOINT", help="replay endpoint, e.g. tcp://*:5558")
    p.add_argument("--publish-topic", default="", help="topic")
    p.add_argument("--speed", type=float, default=1.0, help="times real time; 0 = as fast as it goes")
    p.add_argument("--capacity-tokens", type=int, default=1 << 20, help="the pool's size in tokens")
    p.add_argument("--tokens-per-block", type=int, default=16)
    p.add_argument("--policy", default="lru", help="prefix-cache eviction policy")
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")


def recording(p: argparse.ArgumentParser) -> None:
    p.description = ("Summarise a recording made by `kvscope mirror --record` (blocks cached at "
                     "the end, lost batches, restarts, the prefix forest), or play it back on the "
                     "dashboard with --serve.")
    p.add_argument("file", help=f"a KV-event recording ({SUFFIX}; one named {HISTORY_SUFFIX} from "
                   "before the suffixes were told apart reads the same)")
    p.add_argument("--num-blocks", type=int, default=65_536, help="logical slots (default 65536)")
    p.add_argument("--serve", action="store_true", help="play it back on the dashboard")
    p.add_argument("--speed", type=float, default=None,
                   help="with --serve: times real time (default: as fast as it goes)")
    server_args(p)


def fleet(p: argparse.ArgumentParser) -> None:
    p.description = ("Serve the dashboard on many vLLM / SGLang engines at once: one prefix index "
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
