"""The `kvscope` command table (app/cli/__init__.py): every entry names a function that exists,
a flag variant is chosen only by its own flag, and `kvscope --help` imports nothing of the
project (no torch, no server) because a subcommand's module loads only when it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import COMMANDS, load, main, pick, usage

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "fastapi", "uvicorn", "allocator", "workloads", "zmq")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_and_variant_names_a_function(name):
    command = COMMANDS[name]
    for target in [command.run, command.arguments, *(v.run for v in command.variants),
                   *(v.arguments for v in command.variants)]:
        if target is not None:
            assert callable(load(target)), f"{name}: {target}"


def test_a_variant_runs_only_given_its_own_flag():
    publish = ("kvscope prefix --publish", "app.cli.events:run_prefix_publish", "app.cli.args:prefix_publish")
    assert pick("prefix", ["--publish", "tcp://*:5557"]) == publish
    assert pick("prefix", ["--trace", "t.jsonl", "--publish=tcp://*:5557"]) == publish
    # a longer flag that starts with the same letters is not the variant's
    assert pick("prefix", ["--publish-topic", "x"]) == ("kvscope prefix", "workloads.cli:prefix_main", None)
    assert pick("prefix", []) == ("kvscope prefix", "workloads.cli:prefix_main", None)
    assert pick("route", ["--router", "vllm"])[1] == "app.engines.router_run:router_main"
    assert pick("route", ["--routers"])[1] == "workloads.cli:route_main"


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


def loaded_after(args: list[str]) -> tuple[int, list[str]]:
    """`kvscope ARGS` run in a fresh interpreter: its exit status and the heavy modules it loaded."""
    code = (f"import sys\nfrom app.cli import main\ntry:\n    rc = main({args!r})\n"
            "except SystemExit as e:\n    rc = e.code\n"
            f"print(rc, sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}"
            " or (m.startswith('app.') and m not in ('app.cli', 'app.cli.args'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rc, loaded = r.stdout.splitlines()[-1].split(" ", 1)
    return int(rc), eval(loaded)


def test_help_imports_nothing_of_the_project():
    assert loaded_after(["--help"]) == (0, [])
    assert loaded_after(["no-such-command"]) == (2, [])


@pytest.mark.parametrize("args", [["fleet", "-h"], ["mirror", "-h"], ["recording", "-h"],
                                  ["prefix", "--publish", "tcp://*:5557", "-h"], ["mirror"], ["fleet", "--bogus"]])
def test_a_subcommand_with_a_table_parser_answers_before_loading_torch_or_the_server(args):
    rc, loaded = loaded_after(args)
    assert rc == (0 if "-h" in args else 2)
    assert loaded == []
