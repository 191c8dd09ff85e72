"""The engines' own kv_events.py, from their released wheels, loaded over torch-free stubs.

Wheels are looked for in KVSCOPE_WHEEL_CACHE (default ~/.cache/kvscope/wheels); when missing they
are fetched there with `pip download --no-deps` (CI reaches the package index; the download is
cached, so it happens once per machine). When neither works the tests that need them skip and
say why (under CI=true they fail instead: CI reaches the package index). Only `kv_events.py`
is read out of a wheel; the modules it imports come from stubs/.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

STUBS = Path(__file__).parent / "stubs"
ENGINES = {
    "vllm": ("vllm", "0.33.0", "vllm/distributed/kv_events.py", "vllm.distributed.kv_events"),
    "sglang": ("sglang", "0.5.23", "sglang/srt/disaggregation/kv_events.py",
               "sglang.srt.disaggregation.kv_events"),
}
_loaded: dict[str, object] = {}


def wheel_cache() -> Path:
    return Path(os.environ.get("KVSCOPE_WHEEL_CACHE") or Path.home() / ".cache/kvscope/wheels")


def _find(folder: Path, dist: str, version: str) -> Path | None:
    hits = sorted(glob.glob(str(folder / f"{dist}-{version}-*.whl")))
    return Path(hits[0]) if hits else None


def _download(folder: Path, dist: str, version: str) -> str:
    """Try pip download (as is, then for CPython 3.11 manylinux, which every release has)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-q", "-d", str(folder), f"{dist}=={version}"]
    tries = [base, base + ["--python-version", "3.11", "--implementation", "cp",
                           "--platform", "manylinux_2_34_x86_64", "--platform",
                           "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]]
    why = ""
    for cmd in tries:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = str(exc)
            continue
        if r.returncode == 0 and _find(folder, dist, version):
            return ""
        why = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["pip failed"]
        why = why[0]
    return why


def engine_source(name: str) -> Path:
    """Path of the engine's kv_events.py, extracted once next to its wheel. Skips when the wheel
    is neither cached nor downloadable."""
    dist, version, member, _ = ENGINES[name]
    folder = wheel_cache()
    out = folder / "extracted" / f"{dist}-{version}" / member
    if out.exists():
        return out
    wheel = _find(folder, dist, version)
    if wheel is None:
        why = _download(folder, dist, version)
        wheel = _find(folder, dist, version)
        if wheel is None:
            reason = (f"{dist}=={version} wheel is not in {folder} and `pip download --no-deps "
                      f"{dist}=={version}` failed ({why}); set KVSCOPE_WHEEL_CACHE to a folder "
                      "holding it")
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"{reason} (CI=true: CI reaches the package index, these must run)")
            pytest.skip(reason)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    with zipfile.ZipFile(wheel) as z:
        tmp.write_bytes(z.read(member))
    os.replace(tmp, out)
    return out


def load(name: str):
    """The engine's kv_events module (vllm.distributed.kv_events or sglang's), over the stubs."""
    if name in _loaded:
        return _loaded[name]
    src = engine_source(name)
    modname = ENGINES[name][3]
    if str(STUBS) not in sys.path:
        sys.path.insert(0, str(STUBS))
    pkg = importlib.import_module(modname.rsplit(".", 1)[0])
    assert str(STUBS) in str(pkg.__file__), f"{pkg.__name__} is not kvscope's stub: {pkg.__file__}"
    spec = importlib.util.spec_from_file_location(modname, src)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    _loaded[name] = mod
    return mod
