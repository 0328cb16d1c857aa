# Run protocols on the GPU, one run directory each under results/h200/, and pack them
# into $OUT/runs.tar.gz. Usage: bash scripts/device/panels.sh SECONDS_EACH NAME...
# NAME is a protocol under protocols/ without .toml; "calibration" runs the A/A calibration.
# An unfinished run directory already in results/h200/ (carried back from an earlier
# call) is resumed, not restarted.
. scripts/device/setup.sh || exit 1
limit=$1; shift
mkdir -p results/h200 $OUT/logs
for name in "$@"; do
  out=results/h200/$name
  [ -f $out/summary.json ] && { echo "$name: finished already"; continue; }
  resume=; [ -d $out ] && resume=--resume
  if [ "$name" = calibration ]; then
    cmd="calibrate protocols/calibration/rmsnorm-aa.toml --out $out $resume"
  else
    cmd="run protocols/$name.toml --out $out $resume"
  fi
  start=$(date +%s)
  timeout $limit python3 -m kerneltrial.cli $cmd > $OUT/logs/$name.log 2>&1
  echo "$name: rc=$? in $(( $(date +%s) - start ))s"; tail -2 $OUT/logs/$name.log
  [ -f $out/summary.json ] && python3 -m kerneltrial.cli verify $out | tail -1
done
tar czf $OUT/runs.tar.gz results/h200 && ls -la $OUT
