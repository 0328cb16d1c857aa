# A fleet run (issue 17) on the 2 GPUs of one machine: protocols/rmsnorm.toml with
# `run --ray --replicas 2` and then `--shard cases`, each into results/h200x2/, verified and
# reported, packed into $OUT/runs.tar.gz (logs in $OUT/logs). Usage:
#   bash scripts/device/ray.sh SECONDS_EACH [OUTPREFIX]
# The driver starts the local Ray head itself (`ray.init()` on this machine finds both GPUs;
# each work unit is a Ray task with one GPU). Ray must be installed there: its wheel (76 MiB)
# is over what one device call carries, so .whl/ cannot bring it; a machine without it stops
# here with exit 2. A fleet directory already in results/h200x2/ (carried back from a call cut
# short) is resumed: finished units are kept. The driver gets SIGINT at SECONDS_EACH so that it
# stops cleanly (fleet.json written). Export KERNELTRIAL_SOURCE_COMMIT when the tree is a copy.
# protocols/rmsnorm.toml must be frozen (scripts/device/frozen.sh), unless the first argument is
# --exploratory: bash scripts/device/ray.sh --exploratory SECONDS_EACH [OUTPREFIX]
. scripts/device/frozen.sh; exploratory_flag "$1"; [ $EXPLORATORY = 1 ] && shift
require_frozen protocols/rmsnorm.toml || exit 2
. scripts/device/setup.sh || exit 1
python3 -c "import ray" 2>/dev/null || { echo "Ray is not installed here: pip install 'kerneltrial[ray]'"; exit 2; }
limit=$1; prefix=${2:-rmsnorm-fleet}
mkdir -p results/h200x2 $OUT/logs
for mode in replicas shard; do
  out=results/h200x2/$prefix-$mode
  flags="--replicas 2"; [ $mode = shard ] && flags="--shard cases"
  resume=; [ -f $out/fleet.json ] && resume=--resume
  start=$(date +%s)
  timeout -s INT $limit python3 -m kerneltrial.cli run protocols/rmsnorm.toml --out $out --ray $flags $resume \
    > $OUT/logs/$mode.log 2>&1
  echo "$mode: rc=$? in $(( $(date +%s) - start ))s"; tail -12 $OUT/logs/$mode.log
  python3 -m kerneltrial.cli verify $out > $OUT/logs/$mode-verify.log 2>&1; echo "verify: rc=$?"; tail -1 $OUT/logs/$mode-verify.log
  python3 -m kerneltrial.cli report $out > $OUT/logs/$mode-report.log 2>&1; echo "report: rc=$?"
  tar czf $OUT/runs.tar.gz results/h200x2  # after each fleet: a call cut short keeps what finished
done
ls -la $OUT
