"""Where the engine environment lives (`make engines-env` builds it), and whether it is usable."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_HINT = "`make engines-env` builds it"


def venv() -> Path:
    """The engine venv: KVSCOPE_ENGINE_VENV, else .venv-engine at the repository root."""
    return Path(os.environ.get("KVSCOPE_ENGINE_VENV") or ROOT / ".venv-engine")


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
