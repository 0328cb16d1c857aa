# On the device machine (issues 35 and 38): the sandbox's GPU tests (CUDA IPC under the sandbox,
# the private-stream planted arm), then the frozen isolation-cuda-sandbox protocol (the same kernel in
# kerneltrial's process and in an isolated worker), verified, into the card's results/ folder.
# Usage: KERNELTRIAL_SOURCE_COMMIT=<the commit sent> bash scripts/device/isolation.sh [--exploratory] [OUTNAME]
# OUTNAME: the run directory under $RESULTS (default isolation-cuda-sandbox-frozen; a replication on a card
# whose folder has that run already needs another, e.g. isolation-cuda-sandbox-frozen-r2). The GPU tests'
# log goes into $RESULTS too, as isolation-gpu-tests-<UTC date>.log, and is packed with the run.
. scripts/device/frozen.sh; exploratory_flag "$1"; [ $EXPLORATORY = 1 ] && shift
name=${1:-isolation-cuda-sandbox-frozen}
require_frozen protocols/isolation-cuda-sandbox.toml || exit 2
. scripts/device/setup.sh || exit 1
out=$RESULTS/$name
[ -e $out ] && { echo "refusing: $out exists already (committed earlier?); pass another OUTNAME" >&2; exit 2; }
mkdir -p $OUT/logs $RESULTS
python3 -m pytest -q -p no:cacheprovider -n 0 tests/trial/test_sandbox.py tests/trial/test_isolation.py \
  -k "cuda or gpu" > $OUT/logs/gpu-tests.log 2>&1; echo "gpu tests: rc=$?"; tail -3 $OUT/logs/gpu-tests.log
log=$RESULTS/isolation-gpu-tests-$(date -u +%Y-%m-%d).log; cp $OUT/logs/gpu-tests.log $log
python3 -m kerneltrial.cli run protocols/isolation-cuda-sandbox.toml --out $out > $OUT/logs/run.log 2>&1
echo "run: rc=$?"; tail -4 $OUT/logs/run.log
python3 -m kerneltrial.cli verify $out | tail -2
tar czf $OUT/runs.tar.gz $out $log
python3 - $out <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
for c in s["cases"]:
    arms = {a["name"]: a for a in c["arms"]} if isinstance(c["arms"], list) else c["arms"]
    print(c["case"], {n: round(a.get("median_ns_per_call") or 0) for n, a in arms.items()})
print([w for w in s["warnings"] if "sandbox" in w or "isolat" in w][:3])
PY
