# On the device machine (issue 35): what the host allows the sandbox, the isolated GPU path under
# it (CUDA IPC with a worker of another uid), and the private-stream planted arm through `check`.
# Usage: bash scripts/device/sandbox.sh  (writes $OUT/sandbox.log)
. scripts/device/setup.sh || exit 1
set -o pipefail
{
  python3 -c "import sys; print(sys.version)"
  python3 -c "from kerneltrial.trial import confine; print(confine.host(True))"; which setpriv unshare
  python3 -m pytest -q -p no:cacheprovider -n 0 tests/trial/test_isolation.py -k "gpu" 2>&1 | tail -5
  for iso in "" ; do
    python3 -m kerneltrial.cli check rmsnorm --impl-module tests/fixtures/planted/private_stream.py \
      --impl user:private_stream --no-peers --seeds 1 --shape 4096x4096 --inputs-seed 0 2>&1 | tail -8
  done
} 2>&1 | tee "$OUT/sandbox.log"
