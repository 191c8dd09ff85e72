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

.PHONY: install build run test test-py test-js test-stress test-debug-core bench lint clean engines-env test-engines

install: $(VENV)/.installed

# The compiled core is rebuilt (by pip's editable install) whenever a Cython source changes.
CYTHON_SRC := $(wildcard allocator/*.pyx allocator/*.pxd allocator/*.pxi kvevents/*.pyx)

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

test: install lint test-py test-debug-core test-js

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

# The compiled cores' property tests once more (the allocator's and the fleet index's), against
# the bounds-checked debug build of the compiled modules (KVSCOPE_CYTHON_DEBUG=1, see setup.py: a
# bad index into a memoryview or list is an IndexError with a traceback, not a crash). Built in a
# copy under build-debug/, so the normal in-place build stays as it is; `-P` keeps the
# checkout's own allocator/ and kvevents/ off sys.path.
DEBUG_CORE  := build-debug
DEBUG_TESTS := tests/allocator/test_core_differential.py tests/allocator/test_pool_stateful.py \
	tests/allocator/test_cache_stateful.py tests/allocator/test_prefix_stateful.py \
	tests/allocator/test_policies_differential.py tests/allocator/test_ghost.py tests/allocator/test_core_primitives.py \
	tests/allocator/test_api_boundary.py tests/kvevents/test_fleet_stateful.py \
	tests/kvevents/test_fleet_index.py

test-debug-core: install
	$(PY) -c "import Cython" 2>/dev/null || $(PIP) install -q "Cython>=3.0"
	rm -rf $(DEBUG_CORE) && mkdir -p $(DEBUG_CORE)
	cp setup.py $(DEBUG_CORE)/
	tar -cf - --exclude=__pycache__ --exclude='*.so' --exclude='*.c' --exclude='*.html' allocator kvevents \
		| tar -xf - -C $(DEBUG_CORE)
	cd $(DEBUG_CORE) && KVSCOPE_CYTHON_DEBUG=1 $(abspath $(PY)) setup.py -q build_ext --inplace >/dev/null
	PYTHONPATH=$(abspath $(DEBUG_CORE)) $(PY) -P -c "import allocator, kvevents._index; assert all('/$(DEBUG_CORE)/' in m.__file__ for m in (allocator, kvevents._index)), (allocator.__file__, kvevents._index.__file__)"
	PYTHONPATH=$(abspath $(DEBUG_CORE)) $(PY) -P -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) $(DEBUG_TESTS)

test-js:
	@if command -v node >/dev/null 2>&1; then node --test static/js/tests/; \
	else echo "node not found: JS unit tests need Node.js >= 18" >&2; exit 1; fi

bench: install
	$(PY) -m bench

lint: install
	$(VENV)/bin/ruff check allocator app workloads kvevents tests bench

# The engine environment: vLLM's CPU build beside kvscope, in a venv of its own (.venv-engine),
# and a tiny model directory (`kvscope engines-env`; see app/engines/build_env.py). A second run
# only checks its stamps.
engines-env: install
	$(VENV)/bin/kvscope engines-env --venv $(ENGINE_VENV) --editable . --torch "$(TORCH)"

# Tests that run real vLLM engines (marker `engines`); they need `make engines-env` first, and
# fail (never skip) without it.
test-engines: engines-env
	KVSCOPE_ENGINE_VENV=$(abspath $(ENGINE_VENV)) $(ENGINE_VENV)/bin/python -m pytest -q -m engines \
	  -p no:cacheprovider tests/engines $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .pytest_cache build $(DEBUG_CORE) *.egg-info allocator/*.c allocator/*.so allocator/*.html \
	  kvevents/*.c kvevents/*.so kvevents/*.html
