"""The `kvscope` command line: one table of subcommands, each run by its module's `main(argv)`.

`COMMANDS` names, for every subcommand, the module and function that run it (called with the
arguments after the subcommand's name; it parses them itself and returns the exit status) and
its line in `kvscope --help`. A `Variant` runs another function when a flag is given
(`kvscope prefix --publish ...`, `kvscope route --router ...`). Subcommands implemented elsewhere
(workloads/, app/engines/) are named here by module path like the ones of this package
(serve.py, events.py, fleet.py).

Nothing but the standard library is imported until a subcommand runs: `run` imports its module
then (torch, the server and the engines load only for the subcommands that need them), so
`kvscope --help` and an unknown name answer at once.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import NamedTuple


class Variant(NamedTuple):
    """Given `flag` (`--flag` or `--flag=...`), the subcommand runs `module:function` instead;
    `help`, if any, is its own line under the subcommand's in `kvscope --help`."""

    flag: str
    module: str
    function: str
    help: str | None = None


class Command(NamedTuple):
    module: str
    function: str
    help: str  # one line; `kvscope --help` adds "(kvscope NAME -h)"
    variants: tuple[Variant, ...] = ()


COMMANDS: dict[str, Command] = {
    "serve": Command("app.cli.serve", "serve_main",
                     "run the server: dashboard, REST API, stream, metrics"),
    "open": Command("app.cli.serve", "open_main",
                    "serve pool history recordings (.kvrec) read-only, scrubbable in the dashboard"),
    "record": Command("workloads.record", "record_main",
                      "run a scenario or trace headless on one pool, recording it to a .kvrec"),
    "replay": Command("workloads.cli", "replay_main",
                      "replay an LLM request trace through the serving simulator"),
    "scenario": Command("workloads.cli", "scenario_main",
                        "run a fragmentation / chat / burst / prefix-chat scenario"),
    "prefix": Command("workloads.cli", "prefix_main",
                      "prefix-cache hit ratio vs capacity per policy on a Mooncake trace",
                      (Variant("--publish", "app.cli.events", "prefix_publish_main",
                               "with --publish ENDPOINT, the trace as a live KV-event source"
                               " (kvscope prefix --publish E -h)"),)),
    "route": Command("workloads.cli", "route_main",
                     "routing policies over N replicas: hit ratio vs load vs TTFT",
                     (Variant("--router", "app.engines.router_run", "router_main"),)),
    "mirror": Command("app.cli.events", "mirror_main",
                      "the dashboard on a live vLLM/SGLang engine's prefix cache"),
    "fleet": Command("app.cli.fleet", "fleet_main",
                     "the dashboard on many engines at once: one prefix index, duplication, matches"),
    "recording": Command("app.cli.events", "recording_main",
                         "summarise or play back a mirror's KV-event recording, .kvevents"),
    "demo": Command("app.engines.demo", "demo_main",
                    "real vLLM CPU engines under a Mooncake trace, on the dashboard"),
    "engines-env": Command("app.engines.build_env", "main",
                           "build the engine environment the demo runs vLLM from"),
    "sim-engines": Command("app.engines.sim", "main",
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


def runner(command: Command, argv: list[str]) -> Callable[[list[str]], int | None]:
    """The function that runs `command` with these arguments, its module imported now: the one
    place the command line imports what a subcommand needs."""
    module, function = command.module, command.function
    for variant in command.variants:
        if given(variant.flag, argv):
            module, function = variant.module, variant.function
            break
    return getattr(importlib.import_module(module), function)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        print(f"unknown command {name!r}\n{usage()}", file=sys.stderr)
        return 2
    return int(runner(command, rest)(rest) or 0)
