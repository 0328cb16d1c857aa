# Run whole-model trials on the GPU, one run directory each under the card's results/ folder
# ($RESULTS: results/h200 or results/h100), verify them, and pack that folder into $OUT/runs.tar.gz.
# Usage: bash scripts/device/model.sh [--exploratory] SECONDS_EACH NAME[=OUTNAME]...
# NAME is a protocol under protocols/model/ without .toml; OUTNAME defaults to NAME-model.
# Every protocol must be frozen (kerneltrial protocol freeze; scripts/device/frozen.sh), unless the
# first argument is --exploratory.
. scripts/device/frozen.sh; exploratory_flag "$1"; [ $EXPLORATORY = 1 ] && shift
for arg in "${@:2}"; do require_frozen protocols/model/${arg%%=*}.toml || exit 2; done
. scripts/device/setup.sh || exit 1
limit=$1; shift
python3 -c "import transformers; print('transformers', transformers.__version__)"
mkdir -p $RESULTS $OUT/logs
for arg in "$@"; do
  name=${arg%%=*}; out=$RESULTS/${arg#*=}
  [ "$arg" = "$name" ] && out=$RESULTS/$name-model
  start=$(date +%s)
  timeout $limit python3 -m kerneltrial.cli model protocols/model/$name.toml --out $out > $OUT/logs/$name-model.log 2>&1
  echo "$name: rc=$? in $(( $(date +%s) - start ))s" | tee -a $OUT/logs/times.txt; tail -5 $OUT/logs/$name-model.log
  if [ -f $out/summary.json ]; then
    python3 -m kerneltrial.cli verify $out | tail -1
    python3 -m kerneltrial.cli report $out > /dev/null && cat $out/report.md
  fi
  tar czf $OUT/runs.tar.gz $RESULTS
done
