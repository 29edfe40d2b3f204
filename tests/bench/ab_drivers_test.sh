#!/usr/bin/env bash
# bench/compare/ab_drivers.sh with the same driver on both sides, on tiny random models: a summary line per case
# (timings are not checked), and a clear refusal, exit status 2, for each kind of bad argument.
# Usage: ab_drivers_test.sh REPO DRIVER
set -uo pipefail
repo=$1 driver=$2
ab=$repo/bench/compare/ab_drivers.sh
fail() { echo "FAIL: $*"; exit 1; }

out=$("$ab" "$driver" "$driver" --tiny --runs 2 flux:compile:512 sd3:eager:1024 t5:fuse) || fail "tiny runs exited $?: $out"
echo "$out"
[ "$(echo "$out" | grep -c ' run [12]: A .* | B ')" = 6 ] || fail "expected 6 run lines"
for c in flux:compile:512 sd3:eager:1024 t5:fuse; do
  echo "$out" | grep -q "^$c: median of the runs A [0-9.]* s, B [0-9.]* s, A / B " || fail "no summary for $c"
done

refused() {  # expected message, then the arguments
  local want=$1
  shift
  local err status
  err=$("$ab" "$@" 2>&1 >/dev/null)
  status=$?
  [ $status = 2 ] || fail "'$*' exited $status, expected 2"
  echo "$err" | grep -qF -- "$want" || fail "'$*' said '$err', expected '$want'"
}
refused "usage:" "$driver"
refused "is not an executable driver" "$driver" /nonexistent/driver t5:eager
refused "--runs must be a positive number" "$driver" "$driver" --runs 0 t5:eager
refused "unknown model" "$driver" "$driver" --tiny vae:eager:512
refused "unknown mode" "$driver" "$driver" --tiny flux:jit:512
refused "needs a size, 512 or 1024" "$driver" "$driver" --tiny flux:compile
refused "no inputs for" "$driver" "$driver" --cache /nonexistent/cache sd3:eager:512
echo "ab_drivers.sh: all checks passed"
