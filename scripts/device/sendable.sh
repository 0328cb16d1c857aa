# Run HERE, before a device call: prints the environment to put in front of the device command,
# `KERNELTRIAL_SOURCE_COMMIT=<HEAD> KERNELTRIAL_SOURCE_DIGEST=<sha256 of src/kerneltrial>`, or refuses
# (exit 2) while src/kerneltrial differs from HEAD. The device runs a copy of this working tree made
# when the call starts, and its .git may not know HEAD; scripts/device/setup.sh there refuses a copy
# whose package digest (rundir/provenance.py source_digest, the one provenance.json records) is not
# this one, so an edit made between this check and the call is refused too. A run made from an
# edited tree records a digest its commit does not have and fails verify's "source commit" check
# (session 22: a helper's uncommitted edit of serving/launcher.py cost three GPU runs).
# Usage: env=$(bash scripts/device/sendable.sh) && echo "$env"
cd "$(dirname "$0")/../.."
if ! git diff --quiet HEAD -- src/kerneltrial || [ -n "$(git ls-files --others --exclude-standard -- src/kerneltrial)" ]; then
  echo "refusing: src/kerneltrial differs from HEAD (commit or set aside):" >&2
  git status --short -- src/kerneltrial >&2
  exit 2
fi
digest=$(PYTHONPATH=src python3 -c "from kerneltrial.rundir.provenance import source_digest; print(source_digest())") || exit 2
echo "KERNELTRIAL_SOURCE_COMMIT=$(git rev-parse HEAD) KERNELTRIAL_SOURCE_DIGEST=$digest"
