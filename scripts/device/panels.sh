# Run protocols on the GPU, one run directory each under the card's results/ folder ($RESULTS,
# scripts/device/setup.sh: results/h200 or results/h100), and pack them
# into $OUT/runs.tar.gz. Usage: bash scripts/device/panels.sh SECONDS_EACH NAME[=OUTNAME]...
# NAME is a protocol under protocols/ without .toml (OUTNAME: another run directory name,
# e.g. a re-run after a change); "calibration/NAME" runs the A/A calibration of
# protocols/calibration/NAME.toml ("calibration" alone: rmsnorm-aa); "check" runs the
# correctness gate on every operator at a realistic shape, output kept in results/h200-checks/.
# An unfinished run directory already in $RESULTS/ (carried back from an earlier
# call) is resumed, not restarted. OUTNAME may leave $RESULTS/ (e.g.
# planted/rmsnorm-cheats=../h200-planted/rmsnorm-cheats); everything under results/ is packed.
# Every protocol named must be frozen (scripts/device/frozen.sh), unless the first argument is
# --exploratory: bash scripts/device/panels.sh --exploratory SECONDS_EACH NAME...
. scripts/device/frozen.sh; exploratory_flag "$1"; [ $EXPLORATORY = 1 ] && shift
for arg in "${@:2}"; do
  name=${arg%%=*}; [ "$name" = check ] && continue; [ "$name" = calibration ] && name=calibration/rmsnorm-aa
  require_frozen protocols/$name.toml || exit 2
done
. scripts/device/setup.sh || exit 1
limit=$1; shift
mkdir -p $RESULTS results/h200-checks $OUT/logs
for arg in "$@"; do
  name=${arg%%=*}; out=$RESULTS/${arg#*=}
  [ "$arg" = "$name" ] && out=$RESULTS/${name//\//-}  # no =OUTNAME: calibration/x -> calibration-x
  if [ "$name" = check ]; then  # every operator and implementation (peers too) at realistic shapes
    for spec in rmsnorm:4096x2048 rmsnorm_fp32:4096x2048 fused_add_rmsnorm:4096x2048 gemma_fused_add_rmsnorm:4096x2048 \
                sigmoid_gate_mul:4096x2048 silu_and_mul:4096x12288 zimage_qk_rmsnorm:4096x30x128 \
                zimage_qk_rmsnorm_pair:4096x30x128 softcap_row_argmax:64x262144 softcap_row_argmax:1x262144; do
      op=${spec%%:*}; shape=${spec#*:}
      timeout $limit python3 -m kerneltrial.cli check $op --shape $shape --seeds 2 --jsonl results/h200-checks/$op-$shape.jsonl \
        > results/h200-checks/$op-$shape.txt 2>&1
      echo "check $op $shape: rc=$? $(tail -1 results/h200-checks/$op-$shape.txt)"
    done
    continue
  fi
  [ -f $out/summary.json ] && { echo "$name: finished already"; continue; }
  resume=; [ -d $out ] && resume=--resume
  if [ "${name%%/*}" = calibration ]; then
    [ "$name" = calibration ] && name=calibration/rmsnorm-aa
    cmd="calibrate protocols/$name.toml --out $out $resume"
  else
    cmd="run protocols/$name.toml --out $out $resume"
  fi
  start=$(date +%s)
  timeout $limit python3 -m kerneltrial.cli $cmd > $OUT/logs/${name//\//-}.log 2>&1
  echo "$name: rc=$? in $(( $(date +%s) - start ))s" | tee -a $OUT/logs/times.txt; tail -2 $OUT/logs/${name//\//-}.log
  [ -f $out/summary.json ] && python3 -m kerneltrial.cli verify $out | tail -1
  tar czf $OUT/runs.tar.gz results  # after each run: a call cut short keeps what finished
done
tar czf $OUT/runs.tar.gz results && ls -la $OUT
