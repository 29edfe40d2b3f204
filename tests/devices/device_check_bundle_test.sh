#!/usr/bin/env bash
# scripts.device_check_bundle: the GPU machine's way of running scripts/device_check.sh, dry-run here on the CPU
# plugin. Packages this build with scripts/device_bundle.sh, then runs device_check.sh --bundle --device xla-cpu
# --quick from it, and checks that the bundle holds what the check runs, that the programs load its libraries,
# that the test suites pass and that the images were compared. Also: a missing bundle is refused by name.
#   device_check_bundle_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src="$1"
build="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$src/scripts/device_bundle.sh" --no-build --fast --build-dir "$build" --output "$work/bundle.tar.xz" ||
  fail "device_bundle.sh failed"
listing="$(tar -tJf "$work/bundle.tar.xz")"
for f in ./kiln ./tests/kiln_test_pjrt ./tests/kiln_test_devices ./tests/libkiln_fake_pjrt_plugin.so \
  ./bench/bench_device_step ./BUNDLE ./lib/libdnnl.so.2; do
  grep -qx -- "$f" <<<"$listing" || fail "the bundle lacks $f"
done
grep -qE '^\./lib/lib(c|m|stdc\+\+)\.so' <<<"$listing" && fail "the bundle carries glibc or the C++ runtime"

log="$work/check.log"
"$src/scripts/device_check.sh" --device xla-cpu --quick --bundle "$work/bundle.tar.xz" --build-dir "$work/check" \
  >"$log" 2>&1 || { cat "$log"; fail "device_check.sh exited $?"; }
cat "$log"
grep -q '== programs: from the bundle' "$log" || fail "the check did not run the bundle's programs"
grep -q "libdnnl.so.2 => $work/check/bundle/lib/" "$work/check/device_check/ldd.log" ||
  fail "kiln does not load the bundle's libdnnl"
for suite in pjrt devices; do
  grep -qE "== tests/$suite on xla-cpu: [1-9][0-9]* passed, 0 failed, 0 skipped$" "$log" || fail "tests/$suite did not all pass"
done
images="$(grep -cE '== image .* xla-cpu vs cpu: max=[0-9]+ mean=' "$log")"
[ "$images" -eq 2 ] || fail "expected 2 image comparisons, found $images"

"$src/scripts/device_check.sh" --device xla-cpu --bundle "$work/none.tar.xz" >"$work/missing.log" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "a missing bundle exited $rc, expected 2"
grep -q "none.tar.xz: no such file" "$work/missing.log" || fail "a missing bundle is not named: $(cat "$work/missing.log")"

# Under a budget too small for any stage, each is skipped and said to be, and the run still ends with its summary.
"$src/scripts/device_check.sh" --device xla-cpu --quick --bundle "$work/bundle.tar.xz" --build-dir "$work/check" \
  --budget 25 >"$work/budget.log" 2>&1 || fail "device_check.sh --budget 25 exited $?"
grep -q '^  skipped test_devices: the --budget of 25 s is spent$' "$work/budget.log" ||
  fail "a spent budget does not skip the last stage: $(cat "$work/budget.log")"
grep -q 'skipped test_devices' "$work/check/device_check/summary.txt" || fail "summary.txt lacks the skipped stage"
echo "device_check from a bundle: ok"
