#!/bin/sh
# A write beyond a file-size limit (ulimit -f, as a full disk would refuse it): kiln generate reports the write
# error naming the file and exits 1, the existing output file is unchanged and no temporary file is left.
# usage: file_size_limit_test.sh KILN MODEL WORKDIR
set -u
kiln=$1 model=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
printf 'old image' > "$work/out.png"
# The limit applies to kiln only (the log goes through a pipe, which has no file size).
{ (ulimit -f 1 && exec "$kiln" generate --model "$model" --prompt "a red circle" --height 64 --width 64 --steps 2 \
      --seed 1 --dtype f32 --max-sequence-length 16 --output "$work/out.png") 2>&1; echo "exit status $?"; } \
    | cat > "$work/log"
cat "$work/log"
fail=0
grep -q "exit status 1$" "$work/log" || { echo "FAIL: expected exit status 1"; fail=1; }
grep -q "out.png: write failed: File too large" "$work/log" || { echo "FAIL: no write error naming the file"; fail=1; }
[ "$(cat "$work/out.png")" = "old image" ] || { echo "FAIL: the existing out.png was changed"; fail=1; }
left=$(ls -A "$work" | grep -v -x -e out.png -e log)
[ -z "$left" ] || { echo "FAIL: files left behind: $left"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS"
exit "$fail"
