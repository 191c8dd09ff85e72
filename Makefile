# kvscope — `make run` serves the dashboard and API, `make test` runs every test.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
HOST    ?= $(or $(KVSCOPE_HOST),127.0.0.1)
PORT    ?= $(or $(KVSCOPE_PORT),8000)
# Installed only when no torch imports in .venv; a torch already there (e.g. the CUDA build,
# pip-installed into .venv first on a GPU host) is kept whatever TORCH says.
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=
ENGINE_VENV ?= .venv-engine

.PHONY: install build run test test-py test-js test-stress bench lint clean engines-env test-engines

install: $(VENV)/.installed

# The compiled core is rebuilt (by pip's editable install) whenever a Cython source changes.
CYTHON_SRC := $(wildcard allocator/*.pyx allocator/*.pxd allocator/*.pxi)

$(VENV)/.installed: pyproject.toml setup.py $(CYTHON_SRC)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e '.[test]'
	touch $@

# Rebuild the compiled core in place (what a worktree without its own venv uses).
build:
	$(PY) setup.py build_ext --inplace

run: install
	$(VENV)/bin/kvscope serve --host $(HOST) --port $(PORT)

test: install lint test-py test-js

test-py:
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The browser tests while stress-ng keeps the CPUs busy, STRESS_RUNS times in a row: a test that
# passes only on a quiet machine fails here. Not part of `make test` or CI.
STRESS_CPUS ?= 2
STRESS_RUNS ?= 3
test-stress: install
	@command -v stress-ng >/dev/null 2>&1 || { echo "make test-stress needs stress-ng (Debian: apt-get install stress-ng)" >&2; exit 1; }
	@stress-ng --cpu $(STRESS_CPUS) --timeout 3h --quiet & load=$$!; \
	trap 'kill $$load 2>/dev/null; wait $$load 2>/dev/null' EXIT INT TERM; \
	for i in $$(seq $(STRESS_RUNS)); do \
	  echo "test-stress: run $$i of $(STRESS_RUNS), with stress-ng --cpu $(STRESS_CPUS)"; \
	  $(PY) -m pytest -q -p no:cacheprovider tests/e2e $(PYTEST_ARGS) || exit 1; \
	done; \
	echo "test-stress: $(STRESS_RUNS) runs passed"

test-js:
	@if command -v node >/dev/null 2>&1; then node --test static/js/tests/; \
	else echo "node not found: JS unit tests need Node.js >= 18" >&2; exit 1; fi

bench: install
	$(PY) -m bench

lint: install
	$(VENV)/bin/ruff check allocator app workloads kvevents tests bench

# The engine environment: vLLM's CPU build beside kvscope, in a venv of its own (.venv-engine),
# and a tiny model directory. A second run only checks its stamps.
engines-env:
	ENGINE_VENV=$(ENGINE_VENV) bash scripts/engines-env.sh

# Tests that run real vLLM engines (marker `engines`); they need `make engines-env` first, and
# fail (never skip) without it.
test-engines: engines-env
	KVSCOPE_ENGINE_VENV=$(abspath $(ENGINE_VENV)) $(ENGINE_VENV)/bin/python -m pytest -q -m engines \
	  -p no:cacheprovider tests/engines $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .pytest_cache build *.egg-info allocator/*.c allocator/*.so allocator/*.html
