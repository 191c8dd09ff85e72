"""The `kvscope` command table (app/cli/__init__.py): every entry names a function that exists,
a flag variant is chosen only by its own flag, and `kvscope --help` imports nothing of the
project (no torch, no server) because a subcommand's module loads only when it runs."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import COMMANDS, main, runner, usage

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_and_variant_names_a_function(name):
    command = COMMANDS[name]
    for module, function in [(command.module, command.function),
                             *((v.module, v.function) for v in command.variants)]:
        assert callable(getattr(importlib.import_module(module), function)), f"{name}: {module}:{function}"


def test_a_variant_runs_only_given_its_own_flag():
    from app.cli.events import prefix_publish_main
    from app.engines.router_run import router_main
    from workloads.cli import prefix_main, route_main

    prefix, route = COMMANDS["prefix"], COMMANDS["route"]
    assert runner(prefix, ["--publish", "tcp://*:5557"]) is prefix_publish_main
    assert runner(prefix, ["--trace", "t.jsonl", "--publish=tcp://*:5557"]) is prefix_publish_main
    # a longer flag that starts with the same letters is not the variant's
    assert runner(prefix, ["--publish-topic", "x"]) is prefix_main
    assert runner(prefix, []) is prefix_main
    assert runner(route, ["--router", "vllm"]) is router_main
    assert runner(route, ["--routers"]) is route_main


def test_usage_has_one_line_per_subcommand(capsys):
    text = usage()
    first, *lines = text.splitlines()
    assert first == f"usage: kvscope {{{','.join(COMMANDS)}}} [options]"
    named = [line.split()[0] for line in lines if not line.startswith(" " * 3)]
    assert named == list(COMMANDS)
    for name in COMMANDS:
        assert f"(kvscope {name} -h)" in text
    assert main(["--help"]) == 0 and capsys.readouterr().out == text + "\n"
    assert main([]) == 2
    assert main(["nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("unknown command 'nope'\n") and err.endswith(text + "\n")


def test_help_imports_nothing_of_the_project():
    code = ("import sys\nfrom app.cli import main\nmain(['--help'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'fastapi', 'uvicorn', 'allocator', 'workloads', 'kvevents', 'zmq')"
            " or (m.startswith('app.') and m != 'app.cli')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]"
