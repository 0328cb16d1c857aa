# Run whole-model trials on the GPU, one run directory each under results/h200/, verify them,
# and pack results/ into $OUT/runs.tar.gz. Usage: bash scripts/device/model.sh SECONDS_EACH NAME[=OUTNAME]...
# NAME is a protocol under protocols/model/ without .toml; OUTNAME defaults to NAME-model.
# Every protocol must be frozen (scripts/device/frozen.sh), unless the first argument is
# --exploratory. `kerneltrial protocol freeze` takes kernel protocols only, so a model trial
# runs with --exploratory for now: bash scripts/device/model.sh --exploratory SECONDS_EACH NAME...
. scripts/device/frozen.sh; exploratory_flag "$1"; [ $EXPLORATORY = 1 ] && shift
for arg in "${@:2}"; do require_frozen protocols/model/${arg%%=*}.toml || exit 2; done
. scripts/device/setup.sh || exit 1
limit=$1; shift
python3 -c "import transformers; print('transformers', transformers.__version__)"
mkdir -p results/h200 $OUT/logs
for arg in "$@"; do
  name=${arg%%=*}; out=results/h200/${arg#*=}
  [ "$arg" = "$name" ] && out=results/h200/$name-model
  start=$(date +%s)
  timeout $limit python3 -m kerneltrial.cli model protocols/model/$name.toml --out $out > $OUT/logs/$name-model.log 2>&1
  echo "$name: rc=$? in $(( $(date +%s) - start ))s" | tee -a $OUT/logs/times.txt; tail -5 $OUT/logs/$name-model.log
  if [ -f $out/summary.json ]; then
    python3 -m kerneltrial.cli verify $out | tail -1
    python3 -m kerneltrial.cli report $out > /dev/null && cat $out/report.md
  fi
  tar czf $OUT/runs.tar.gz results
done
