"""The `kvscope` command line: one table of subcommands.

`COMMANDS` names, for every subcommand, what runs it and its line in `kvscope --help`. `run` is
`module:function`. Without `arguments`, the function is called with the arguments after the
subcommand's name, parses them itself and returns the exit status (the subcommands of
workloads/ and app/engines/, `serve` and `open`). With `arguments` (`module:function` in
app/cli/args.py, which imports nothing heavy), the parser `kvscope NAME` is built from it here,
and the function gets the parsed arguments and the parser. A `Variant` runs another function
given a flag (`kvscope prefix --publish ...`, `kvscope route --router ...`).

`load` is the one place the command line imports what a subcommand needs, when it runs: so
`kvscope --help` and an unknown name load nothing but the standard library, and a subcommand
with `arguments` answers `-h` or a bad flag before torch or the server load.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import NamedTuple


class Variant(NamedTuple):
    """Given `flag` (`--flag` or `--flag=...`), the subcommand runs this instead, its parser
    named `kvscope NAME FLAG`; `help`, if any, is its own line under the subcommand's in
    `kvscope --help`."""

    flag: str
    run: str
    arguments: str | None = None
    help: str | None = None


class Command(NamedTuple):
    run: str  # module:function
    help: str  # one line; `kvscope --help` adds "(kvscope NAME -h)"
    arguments: str | None = None  # module:function adding the arguments to the parser
    variants: tuple[Variant, ...] = ()


COMMANDS: dict[str, Command] = {
    "serve": Command("app.cli.serve:serve_main", "run the server: dashboard, REST API, stream, metrics"),
    "open": Command("app.cli.serve:open_main",
                    "serve pool history recordings (.kvrec) read-only, scrubbable in the dashboard"),
    "record": Command("workloads.record:record_main",
                      "run a scenario or trace headless on one pool, recording it to a .kvrec"),
    "replay": Command("workloads.cli:replay_main", "replay an LLM request trace through the serving simulator"),
    "scenario": Command("workloads.cli:scenario_main", "run a fragmentation / chat / burst / prefix-chat scenario"),
    "prefix": Command("workloads.cli:prefix_main",
                      "prefix-cache hit ratio vs capacity per policy on a Mooncake trace",
                      variants=(Variant("--publish", "app.cli.events:run_prefix_publish",
                                        "app.cli.args:prefix_publish",
                                        "with --publish ENDPOINT, the trace as a live KV-event source"
                                        " (kvscope prefix --publish E -h)"),)),
    "route": Command("workloads.cli:route_main", "routing policies over N replicas: hit ratio vs load vs TTFT",
                     variants=(Variant("--router", "app.engines.router_run:router_main"),)),
    "mirror": Command("app.cli.events:run_mirror", "the dashboard on a live vLLM/SGLang engine's prefix cache",
                      "app.cli.args:mirror"),
    "fleet": Command("app.cli.fleet:run_fleet",
                     "the dashboard on many engines at once: one prefix index, duplication, matches",
                     "app.cli.args:fleet"),
    "recording": Command("app.cli.events:run_recording",
                         "summarise or play back a mirror's KV-event recording, .kvevents",
                         "app.cli.args:recording"),
    "demo": Command("app.engines.demo:demo_main", "real vLLM CPU engines under a Mooncake trace, on the dashboard"),
    "engines-env": Command("app.engines.build_env:main", "build the engine environment the demo runs vLLM from"),
    "sim-engines": Command("app.engines.sim:main",
                           "simulated OpenAI engines, no GPU: prefix caches, /metrics, KV events"),
}

INDENT = 13  # where a subcommand's help starts in the usage


def usage() -> str:
    lines = [f"usage: kvscope {{{','.join(COMMANDS)}}} [options]"]
    for name, command in COMMANDS.items():
        line = f"  {name:<9}  {command.help} (kvscope {name} -h)"
        for variant in command.variants:
            if variant.help:
                line += ";\n" + " " * INDENT + variant.help
        lines.append(line)
    return "\n".join(lines)


def given(flag: str, argv: list[str]) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def load(target: str) -> Callable:
    """`module:function`, its module imported now."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def pick(name: str, argv: list[str]) -> tuple[str, str, str | None]:
    """(the parser's name, what runs, what adds its arguments) for `kvscope NAME ARGV`."""
    command = COMMANDS[name]
    for variant in command.variants:
        if given(variant.flag, argv):
            return f"kvscope {name} {variant.flag}", variant.run, variant.arguments
    return f"kvscope {name}", command.run, command.arguments


def run(name: str, argv: list[str]) -> int:
    prog, target, arguments = pick(name, argv)
    if arguments is None:
        return int(load(target)(argv) or 0)
    parser = argparse.ArgumentParser(prog=prog)
    load(arguments)(parser)
    args = parser.parse_args(argv)
    return int(load(target)(args, parser) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n{usage()}", file=sys.stderr)
        return 2
    return run(name, rest)
