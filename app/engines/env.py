"""Where the engine environment lives (`kvscope engines-env` builds it), and whether it is usable.

Looked for in this order: KVSCOPE_ENGINE_VENV; the checkout's `.venv-engine` when kvscope runs
from a checkout that has one (`make engines-env` builds it there); else the per-user location
`kvscope engines-env` builds by default ($XDG_DATA_HOME/kvscope/engine-venv, else
~/.local/share/kvscope/engine-venv). An installed package never looks inside site-packages.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_HINT = "`kvscope engines-env` builds it"


def checkout() -> Path | None:
    """The kvscope checkout this package runs from, or None for an installed package."""
    if (ROOT / "pyproject.toml").is_file() and (ROOT / "app" / "engines").is_dir():
        return ROOT
    return None


def user_venv() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data).expanduser() / "kvscope" / "engine-venv"


def build_target() -> Path:
    """Where `kvscope engines-env` builds without --venv: KVSCOPE_ENGINE_VENV, else per user."""
    given = os.environ.get("KVSCOPE_ENGINE_VENV")
    return Path(given).expanduser() if given else user_venv()


def venv() -> Path:
    """The engine venv the demo and the engine tests use (see the module's docstring)."""
    given = os.environ.get("KVSCOPE_ENGINE_VENV")
    if given:
        return Path(given).expanduser()
    root = checkout()
    if root is not None and (root / ".venv-engine").is_dir():
        return root / ".venv-engine"
    return user_venv()


def python() -> Path:
    return venv() / "bin" / "python"


def model_dir() -> Path:
    """The tiny Llama model directory (config and tokenizer; the weights are made up)."""
    return venv() / "tiny-llama"


def missing() -> str | None:
    """Why the engine environment cannot run an engine (one line), or None when it can."""
    v = venv()
    if not python().exists():
        return f"no engine environment at {v} ({BUILD_HINT})"
    if not (v / ".stamp-import").exists():
        return f"the engine environment at {v} is incomplete ({BUILD_HINT})"
    if not (model_dir() / "config.json").exists() or not (model_dir() / "tokenizer.json").exists():
        return f"no tiny model at {model_dir()} ({BUILD_HINT})"
    return None
