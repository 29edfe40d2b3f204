#!/bin/sh
# SIGINT or SIGTERM during denoising: kiln generate stops within a step, exits with 128 + the signal, says
# where it stopped, and leaves the existing output file as it was, with no temporary file beside it.
# usage: interrupt_test.sh KILN MODEL WORKDIR INT|TERM EXPECTED_STATUS
set -u
kiln=$1 model=$2 work=$3 sig=$4 want=$5
rm -rf "$work" && mkdir -p "$work" || exit 1
printf 'old image' > "$work/out.png"
"$kiln" generate --model "$model" --prompt "a red circle" --height 256 --width 256 --steps 1000 --seed 1 \
    --dtype f32 --max-sequence-length 16 --output "$work/out.png" 2> "$work/stderr" &
pid=$!
tries=0
until grep -q "denoising .* [1-9][0-9]*/1000" "$work/stderr"; do
  if ! kill -0 "$pid" 2> /dev/null; then echo "FAIL: kiln ended before the signal"; cat "$work/stderr"; exit 1; fi
  tries=$((tries + 1))
  if [ "$tries" -gt 1200 ]; then echo "FAIL: no denoising step within 60 s"; kill -9 "$pid"; exit 1; fi
  sleep 0.05
done
sent=$(date +%s%N)
kill -s "$sig" "$pid"
wait "$pid"
status=$?
took_ms=$(( ($(date +%s%N) - sent) / 1000000 ))
cat "$work/stderr"
echo "exit status $status, ${took_ms} ms after SIG$sig"
fail=0
[ "$status" -eq "$want" ] || { echo "FAIL: expected exit status $want"; fail=1; }
grep -q "stopped by SIG$sig after denoising step" "$work/stderr" || { echo "FAIL: no 'stopped by SIG$sig after denoising step'"; fail=1; }
[ "$took_ms" -lt 10000 ] || { echo "FAIL: took more than 10 s to stop"; fail=1; }
[ "$(cat "$work/out.png")" = "old image" ] || { echo "FAIL: the existing out.png was changed"; fail=1; }
left=$(ls -A "$work" | grep -v -x -e out.png -e stderr)
[ -z "$left" ] || { echo "FAIL: files left behind: $left"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS"
exit "$fail"
