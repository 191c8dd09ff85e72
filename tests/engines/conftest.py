"""Fixtures of the engine tests: real vLLM engines (CPU build) from the engine environment.

Every test here carries the `engines` marker; the default run deselects them (pyproject's
addopts) and `make test-engines` runs them with the engine venv's Python. Without a usable
engine environment they fail, naming what is missing: they never skip.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from app.engines import env

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
# For the engines built in this process: integer GiB of KV space (the block count is fixed per
# test), and no pinning of OpenMP threads to cores other engineers' processes share.
for key, value in {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                   "OMP_NUM_THREADS": "1", "VLLM_NO_USAGE_STATS": "1",
                   "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(key, value)


FIGURES: list[str] = []


@pytest.fixture(scope="session")
def figures() -> list[str]:
    """Measured figures (boot time, RSS, requests compared): shown in the run's summary."""
    return FIGURES


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("engine figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.engines)


@pytest.fixture(scope="session")
def engine_env() -> Path:
    """The tiny model directory, once the environment is known to run an engine here."""
    why = env.missing()
    if why:
        pytest.fail(f"engine tests cannot run: {why}", pytrace=False)
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # the tests must run inside the engine venv
        pytest.fail(f"engine tests cannot run: `import vllm` failed in {sys.executable} ({exc}); "
                    f"run them with {env.python()} (`make test-engines`)", pytrace=False)
    return env.model_dir()
