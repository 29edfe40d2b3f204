#!/bin/sh
# kiln generate --num-images 2: one call writes OUTPUT-0.png and OUTPUT-1.png (not OUTPUT.png), two different
# images, and says so for each.
# usage: num_images_test.sh KILN MODEL WORKDIR
set -u
kiln=$1 model=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
"$kiln" generate --model "$model" --prompt "a red circle" --height 32 --width 32 --steps 2 --seed 3 \
    --dtype f32 --max-sequence-length 16 --num-images 2 --output "$work/out.png" 2> "$work/stderr"
status=$?
cat "$work/stderr"
fail=0
[ "$status" -eq 0 ] || { echo "FAIL: exit status $status"; fail=1; }
for i in 0 1; do
  [ -s "$work/out-$i.png" ] || { echo "FAIL: no out-$i.png"; fail=1; }
  grep -q "wrote $work/out-$i.png (32x32, seed 3)" "$work/stderr" || { echo "FAIL: out-$i.png not reported"; fail=1; }
done
[ ! -e "$work/out.png" ] || { echo "FAIL: out.png written too"; fail=1; }
if cmp -s "$work/out-0.png" "$work/out-1.png"; then echo "FAIL: the two images are the same"; fail=1; fi
[ "$fail" -eq 0 ] && echo "PASS"
exit "$fail"
