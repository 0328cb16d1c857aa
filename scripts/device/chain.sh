# The Track 1 chain on the GPU for an operator whose confirmation protocol
# (protocols/OP-confirm.toml) is frozen and whose dispatcher module and rule are
# src/kerneltrial/ops/OP.py and OP.rule.toml: run the confirmation, replicate it N times,
# package the confirmed module (interface check on this GPU under --target ascend), inspect
# the archive; then the planted 70000-program grid under both targets. Everything lands under
# results/h200/ and submissions/, packed into $OUT/runs.tar.gz.
# Usage: bash scripts/device/chain.sh [--exploratory] OP [N] (the confirmation protocol must be
# frozen, scripts/device/frozen.sh; `run` refuses an unfrozen confirmation whatever the flag).
. scripts/device/frozen.sh; exploratory_flag "$1"; [ $EXPLORATORY = 1 ] && shift
require_frozen protocols/$1-confirm.toml || exit 2
. scripts/device/setup.sh || exit 1
op=$1; n=${2:-3}
conf=protocols/$op-confirm.toml; out=results/h200/$op-confirm; reps=$out-replicates
mkdir -p $OUT/logs submissions
kt() { python3 -m kerneltrial.cli "$@"; }
pack() { tar czf $OUT/runs.tar.gz results/h200/$op-confirm* submissions; }
if [ ! -f $out/summary.json ]; then
  resume=; [ -d $out ] && resume=--resume
  kt run $conf --out $out $resume > $OUT/logs/confirm.log 2>&1; echo "confirm: rc=$?"; tail -3 $OUT/logs/confirm.log
fi
kt verify $out | tail -1; pack
kt replicate $conf --runs $n --out $reps > $OUT/logs/replicates.log 2>&1; echo "replicate: rc=$?"
tail -5 $OUT/logs/replicates.log; kt verify $reps | tail -1; pack
confirmed="--confirmed $out"; for r in $reps/run-*; do confirmed="$confirmed --confirmed $r"; done
kt package $op src/kerneltrial/ops/$op.py --data src/kerneltrial/ops/$op.rule.toml $confirmed --target ascend \
  --out submissions/$op.zip > $OUT/logs/package.log 2>&1; echo "package: rc=$?"; tail -3 $OUT/logs/package.log
kt inspect submissions/$op.zip --op $op --receipt submissions/$op.receipt.json; echo "inspect: rc=$?"; pack
for target in ascend nvidia; do
  kt check rmsnorm --impl-module tests/fixtures/planted/huge_grid.py --target $target --shape 4x64 > $OUT/logs/huge_grid-$target.log 2>&1
  echo "planted huge_grid, --target $target: rc=$? $(grep -m1 -i 'grid' $OUT/logs/huge_grid-$target.log)"
done
