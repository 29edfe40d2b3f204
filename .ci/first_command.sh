#!/usr/bin/env bash
# CI's first stage: the README's first command, as written, in the state a newcomer has. In a copy of this checkout
# of its own (so its build/ is the newcomer's and the test command's build is not disturbed), with Kiln's cache an
# empty folder (no PJRT header or plugin fetched, no kernels compiled: KILN_CACHE_DIR) and, on CI's fresh machine,
# before the test command installs anything. Then checks what the newcomer got:
#   - output.png is written and is the README's picture (docs/images/shapes_default.png), pixel for pixel within
#     one 8-bit level (CPUs whose kernels round differently may move a level);
#   - the build is the one without PJRT (the configuration only a newcomer reaches), and says so when asked for
#     a PJRT device, rather than failing on something else.
# Prints the command's wall time. ccache is shared (its folder is not Kiln's cache), so the test command's build
# reuses these objects.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
command="$(.ci/readme_command 1)"
work="$(mktemp -d "${TMPDIR:-/tmp}/kiln-newcomer.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/kiln" "$work/cache"
# The checkout as it stands: tracked and new files, nothing that git ignores (no build folder, no output.png).
git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$work/kiln"

echo "ci: the README's first command, as a newcomer (in $work/kiln, KILN_CACHE_DIR empty):"
echo "    $command"
start=$(date +%s)
(cd "$work/kiln" && KILN_CACHE_DIR="$work/cache" bash -euo pipefail -c "$command")
seconds=$(( $(date +%s) - start ))
echo "ci: the README's first command passed in ${seconds} s"

fail() { echo "ci: the README's first command: $*" >&2; exit 1; }
[ -s "$work/kiln/output.png" ] || fail "no output.png was written"
python3 "$repo/.ci/png_difference.py" "$work/kiln/output.png" "$repo/docs/images/shapes_default.png" --max-levels 1 ||
  fail "output.png is not the README's picture (docs/images/shapes_default.png)"
devices="$(cd "$work/kiln" && KILN_CACHE_DIR="$work/cache" ./build/kiln info --devices 2>&1)" ||
  fail "kiln info --devices failed: $devices"
grep -q "^xla-cpu: none (PJRT: this build of Kiln has no PJRT support" <<<"$devices" ||
  fail "the newcomer's build should be the one without PJRT and say so; kiln info --devices printed:
$devices"
echo "ci: the newcomer's build has no PJRT and says so; output.png is the README's picture"
