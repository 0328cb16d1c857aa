# Source on the device machine: installs the carried wheels (.whl, made by
# scripts/device/fetch_wheels.sh) into /tmp/site and
# puts them and the package's src/ on PYTHONPATH; RESULTS is the results/ folder of the card it
# runs on (results/h200 or results/h100). Usage: . scripts/device/setup.sh
# The sender's package digest (scripts/device/sendable.sh): the copy that arrived must be that code.
# A commit without its digest is refused: the copy's .git rarely knows the commit, so nothing else checks it.
if [ -n "$KERNELTRIAL_SOURCE_COMMIT" ] && [ -z "$KERNELTRIAL_SOURCE_DIGEST" ]; then
  echo "refusing: KERNELTRIAL_SOURCE_COMMIT without KERNELTRIAL_SOURCE_DIGEST; put the output of" \
    "scripts/device/sendable.sh (run before the call, on the sending side) in front of the command" >&2
  return 1
fi
if [ -n "$KERNELTRIAL_SOURCE_DIGEST" ]; then
  here=$(PYTHONPATH=$PWD/src python3 -c "from kerneltrial.rundir.provenance import source_digest; print(source_digest())")
  if [ "$here" != "$KERNELTRIAL_SOURCE_DIGEST" ]; then
    echo "refusing: src/kerneltrial here digests to $here, not the sender's $KERNELTRIAL_SOURCE_DIGEST" \
      "(edited between scripts/device/sendable.sh and the call?)" >&2
    return 1
  fi
fi
if ls .whl/*.whl > /dev/null 2>&1; then  # none carried: what the machine has
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
fi
# The commit the evidence names is the sender's: pass it literally (KERNELTRIAL_SOURCE_COMMIT=<hash>),
# never `$(git rev-parse HEAD)` here, where the copy's .git may be older than its files. A commit
# this .git knows whose src/kerneltrial differs from the files that will run (edited or added) is refused.
if [ -n "$KERNELTRIAL_SOURCE_COMMIT" ] && git cat-file -e "$KERNELTRIAL_SOURCE_COMMIT^{commit}" 2> /dev/null \
  && { ! git diff --quiet "$KERNELTRIAL_SOURCE_COMMIT" -- src/kerneltrial \
    || [ -n "$(git ls-files --others --exclude-standard -- src/kerneltrial)" ]; }; then
  echo "refusing: KERNELTRIAL_SOURCE_COMMIT=$KERNELTRIAL_SOURCE_COMMIT is not the code here" \
    "(src/kerneltrial differs from it); pass the sending checkout's commit hash literally" >&2
  return 1
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*) RESULTS=results/h200 ;; *H100*) RESULTS=results/h100 ;; *) RESULTS=results/gpu ;;
esac
export RESULTS
