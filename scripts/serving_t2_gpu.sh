#!/usr/bin/env bash
# Track 2 on one GPU machine, in one command (docs/serving.md, "GPU install recipe"): install the
# pinned serving stack into a fresh venv, run the E0-E3 trial of MiniCPM5-2B
# (protocols/serving/minicpm5-2b-t2.toml), then verify and report it.
#
#   bash scripts/serving_t2_gpu.sh /models/MiniCPM5-2B [OUT]
#
# Environment (all optional):
#   KT_VENV      the venv to create or reuse             (default ~/kt-vllm-fl)
#   KT_SRC       where vllm-plugin-FL and FlagGems are cloned (default ~/kt-src)
#   KT_CLIENT    official (the organisers' vllm bench serve argv, default) or completions
#   KT_MATH500   MATH-500 test.jsonl for the accuracy gate (default: the protocol's
#                ../shared/data/math500/test.jsonl next to the checkout)
#   KT_VLLM      the vLLM requirement to install (default: the one vllm-plugin-FL's pyproject.toml names)
#   KT_SKIP_INSTALL=1  reuse the venv as it is (the pins still refuse a mismatch)
#   KT_DRY_RUN=1       print the pins, the vLLM requirement and the trial command, and stop
# The pins (vllm-plugin-FL branch and commit, FlagGems version) are read from the protocol's [pins];
# vLLM is the version that vllm-plugin-FL commit's pyproject.toml names. Not run by kerneltrial's CI
# (no vLLM GPU build fits the machines it has): tests/serving/test_gpu_script.py checks its syntax and
# the parts that run without a GPU.
# Exit status: the trial's (0 ACCEPTED, 1 REJECTED/INCONCLUSIVE or a failed run, 2 bad input).
set -euo pipefail

MODEL=${1:?usage: bash scripts/serving_t2_gpu.sh MODEL_DIR [OUT]}
OUT=${2:-runs/t2-minicpm5-2b-$(date +%Y%m%d-%H%M%S)}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PROTOCOL=$REPO/protocols/serving/minicpm5-2b-t2.toml
VENV=${KT_VENV:-$HOME/kt-vllm-fl}
SRC=${KT_SRC:-$HOME/kt-src}
CLIENT=${KT_CLIENT:-official}

pin() {  # pin KEY: a value of the protocol's [pins] (python3 >= 3.11 for tomllib)
  python3 -c "import sys, tomllib; p = tomllib.load(open(sys.argv[1], 'rb')).get('pins', {}); \
fl = p.get('vllm_plugin_fl', {}); print({'branch': fl.get('branch', ''), 'commit': fl.get('commit', ''), \
'flag_gems': p.get('flag_gems', '')}[sys.argv[2]])" "$PROTOCOL" "$1"
}
vllm_requirement() {  # KT_VLLM, else the vLLM this vllm-plugin-FL checkout names (its dependencies, else
  # its test extra, e.g. vllm[audio]==0.13.0; its README: "Install vllm from the official v0.13.0")
  if [ -n "${KT_VLLM:-}" ]; then echo "$KT_VLLM"; return; fi
  python3 -c "import re, sys, tomllib; p = tomllib.load(open(sys.argv[1], 'rb'))['project']; \
reqs = p.get('dependencies', []) + sum(p.get('optional-dependencies', {}).values(), []); \
r = next(r for r in reqs if re.split(r'[\[<>=!~ ;]', r, maxsplit=1)[0].lower() == 'vllm'); \
print(re.sub(r'\[[^]]*\]', '', r))" "$SRC/vllm-plugin-FL/pyproject.toml"
}
FL_BRANCH=$(pin branch)
FL_COMMIT=$(pin commit)
GEMS_VERSION=$(pin flag_gems)
[ -d "$MODEL" ] || { echo "error: model directory $MODEL not found; pass the MiniCPM5-2B checkpoint" >&2; exit 2; }
command -v nvidia-smi > /dev/null || echo "warning: no nvidia-smi: the run's scope will be proxy" >&2

if [ "${KT_DRY_RUN:-0}" = 1 ]; then  # what it would install and run (tests/serving/test_gpu_script.py)
  echo "vllm-plugin-FL $FL_BRANCH@$FL_COMMIT"
  echo "FlagGems v$GEMS_VERSION"
  [ -f "$SRC/vllm-plugin-FL/pyproject.toml" ] && echo "vLLM $(vllm_requirement)"
  echo "kerneltrial serve trial $PROTOCOL --model $MODEL --vllm $VENV/bin/vllm --client $CLIENT --out $OUT"
  exit 0
fi

if [ "${KT_SKIP_INSTALL:-0}" != 1 ]; then
  python3 -m venv "$VENV"
  . "$VENV/bin/activate"
  python -m pip install -U pip
  mkdir -p "$SRC"
  # vllm-plugin-FL at the pinned commit, on the pinned branch (the probe reads both from the checkout)
  [ -d "$SRC/vllm-plugin-FL/.git" ] || git clone https://github.com/flagos-ai/vllm-plugin-FL "$SRC/vllm-plugin-FL"
  git -C "$SRC/vllm-plugin-FL" fetch origin "$FL_BRANCH"
  git -C "$SRC/vllm-plugin-FL" checkout -B "$FL_BRANCH" "$FL_COMMIT"
  python -m pip install "$(vllm_requirement)"
  # FlagGems at the pinned version (its tag vX.Y.Z), built as its getting-started guide says
  python -m pip install -U "scikit-build-core==0.11" pybind11 ninja cmake
  [ -d "$SRC/FlagGems/.git" ] || git clone https://github.com/flagos-ai/FlagGems "$SRC/FlagGems"
  git -C "$SRC/FlagGems" fetch --tags origin
  git -C "$SRC/FlagGems" checkout "v$GEMS_VERSION"
  python -m pip install --no-build-isolation "$SRC/FlagGems"
  python -m pip install --no-build-isolation -e "$SRC/vllm-plugin-FL"
  # kerneltrial in the same venv: its vllm_fl.plugin entry point adds the vendor kerneltrial kernels
  python -m pip install -e "$REPO[serve]"
else
  . "$VENV/bin/activate"
fi

python -c "import vllm, vllm_fl, flag_gems; print('vllm', vllm.__version__, '| flag_gems', flag_gems.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

RUN_PROTOCOL=$PROTOCOL
if [ -n "${KT_MATH500:-}" ]; then  # the same protocol with the accuracy data elsewhere
  RUN_PROTOCOL=$(mktemp -d)/minicpm5-2b-t2.toml
  python -c "import sys, tomllib, tomli_w; d = tomllib.load(open(sys.argv[1], 'rb')); d['accuracy']['data'] = sys.argv[2]; \
open(sys.argv[3], 'wb').write(tomli_w.dumps(d).encode())" "$PROTOCOL" "$KT_MATH500" "$RUN_PROTOCOL"
fi

rc=0
kerneltrial serve trial "$RUN_PROTOCOL" --model "$MODEL" --vllm "$VENV/bin/vllm" --client "$CLIENT" --out "$OUT" || rc=$?
if [ -f "$OUT/summary.json" ]; then
  kerneltrial verify "$OUT" || rc=1
  kerneltrial report "$OUT"
  echo "report: $OUT/report.md"
fi
exit $rc
