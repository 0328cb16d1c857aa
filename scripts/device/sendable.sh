# Run HERE, before a device call: prints the commit to pass as KERNELTRIAL_SOURCE_COMMIT, or refuses
# (exit 2) while src/kerneltrial differs from HEAD. The device runs a copy of this working tree, and
# its .git may not know HEAD, so setup.sh there cannot always tell; a run made from an edited tree
# records a source digest its commit does not have and fails verify's "source commit" check
# (session 22: a helper's uncommitted edit of serving/launcher.py cost three GPU runs).
# Usage: commit=$(bash scripts/device/sendable.sh) && echo "$commit"
cd "$(dirname "$0")/../.."
if ! git diff --quiet HEAD -- src/kerneltrial || [ -n "$(git ls-files --others --exclude-standard -- src/kerneltrial)" ]; then
  echo "refusing: src/kerneltrial differs from HEAD (commit or set aside):" >&2
  git status --short -- src/kerneltrial >&2
  exit 2
fi
git rev-parse HEAD
