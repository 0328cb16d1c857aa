# Run protocols on the GPU, one run directory each under results/h200/, and pack them
# into $OUT/runs.tar.gz. Usage: bash scripts/device/panels.sh SECONDS_EACH NAME[=OUTNAME]...
# NAME is a protocol under protocols/ without .toml (OUTNAME: another run directory name,
# e.g. a re-run after a change); "calibration" runs the A/A calibration; "check" runs
# `kerneltrial check --all` on the GPU panels and keeps its output in results/h200/.
# An unfinished run directory already in results/h200/ (carried back from an earlier
# call) is resumed, not restarted.
. scripts/device/setup.sh || exit 1
limit=$1; shift
mkdir -p results/h200 $OUT/logs
for arg in "$@"; do
  name=${arg%%=*}; out=results/h200/${arg#*=}
  if [ "$name" = check ]; then
    timeout $limit python3 -m kerneltrial.cli check --all --no-peers --seeds 1 --jsonl results/h200/check-all.jsonl > results/h200/check-all.txt 2>&1
    echo "check --all: rc=$?"; tail -1 results/h200/check-all.txt; continue
  fi
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
