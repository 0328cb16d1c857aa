# Run a protocol suite on the GPU into results/h200/OUTNAME, verify it, write its report, and
# pack it into $OUT/runs.tar.gz (logs in $OUT/logs). Usage:
#   bash scripts/device/suite.sh NAME TAG [OUTNAME]
# NAME: protocols/NAME/ (e.g. minicpm5-2b); OUTNAME defaults to NAME-TAG. A suite directory
# already in results/h200/ (carried back from an earlier call that was cut short) is resumed:
# finished runs are kept. The suite gets SIGINT at 540 s so that it stops cleanly (rows kept,
# suite.json written) and the pack still happens inside a 600 s call; call again to go on.
# Export KERNELTRIAL_SOURCE_COMMIT when the tree is a copy (see scripts/device/panels.sh).
# Every protocol of protocols/NAME/ must be frozen (scripts/device/frozen.sh), unless the first
# argument is --exploratory: bash scripts/device/suite.sh --exploratory NAME TAG [OUTNAME]
. scripts/device/frozen.sh; exploratory_flag "$1"; [ $EXPLORATORY = 1 ] && shift
require_frozen protocols/$1/*.toml || exit 2
. scripts/device/setup.sh || exit 1
name=$1; tag=$2; out=results/h200/${3:-$name-$tag}
mkdir -p results/h200 $OUT/logs
resume=; [ -f $out/suite.json ] && resume=--resume
start=$(date +%s)
timeout -s INT 540 python3 -m kerneltrial.cli suite $name --tag $tag --out $out $resume > $OUT/logs/suite.log 2>&1
echo "suite $name tag $tag: rc=$? in $(( $(date +%s) - start ))s"; tail -8 $OUT/logs/suite.log
python3 -m kerneltrial.cli verify $out > $OUT/logs/verify.log 2>&1; echo "verify: rc=$?"; tail -1 $OUT/logs/verify.log
python3 -m kerneltrial.cli report $out > $OUT/logs/report.log 2>&1; echo "report: rc=$?"
tar czf $OUT/runs.tar.gz $out && ls -la $OUT
