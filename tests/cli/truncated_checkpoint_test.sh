#!/bin/sh
# The transformer's checkpoint is truncated while kiln generate denoises with it (its weights read in place from
# the mapping): the run ends with a message naming the file, either the check between steps (exit 1) or the
# SIGBUS handler when a step touched a lost page first (exit 74), never a crash; no image is written.
# usage: truncated_checkpoint_test.sh KILN MODEL WORKDIR
set -u
kiln=$1 model=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
cp -r "$model" "$work/model" || exit 1
weights="$work/model/transformer/diffusion_pytorch_model.safetensors"
"$kiln" generate --model "$work/model" --prompt "a red circle" --height 256 --width 256 --steps 1000 --seed 1 \
    --dtype f32 --max-sequence-length 16 --packed-weights none --output "$work/out.png" 2> "$work/stderr" &
pid=$!
tries=0
until grep -q "denoising .* [1-9][0-9]*/1000" "$work/stderr"; do
  if ! kill -0 "$pid" 2> /dev/null; then echo "FAIL: kiln ended before the truncation"; cat "$work/stderr"; exit 1; fi
  tries=$((tries + 1))
  if [ "$tries" -gt 1200 ]; then echo "FAIL: no denoising step within 60 s"; kill -9 "$pid"; exit 1; fi
  sleep 0.05
done
truncate -s 4096 "$weights"
wait "$pid"
status=$?
cat "$work/stderr"
echo "exit status $status"
fail=0
case "$status" in
  1) grep -q "diffusion_pytorch_model.safetensors: truncated while in use" "$work/stderr" || fail=1 ;;
  74) grep -q "diffusion_pytorch_model.safetensors: the file was truncated or changed while Kiln was reading it" \
          "$work/stderr" || fail=1 ;;
  *) fail=1 ;;
esac
[ "$fail" -eq 0 ] || echo "FAIL: expected exit 1 or 74 with a message naming the file"
[ ! -e "$work/out.png" ] || { echo "FAIL: an image was written"; fail=1; }
left=$(ls -A "$work" | grep -v -x -e model -e stderr)
[ -z "$left" ] || { echo "FAIL: files left behind: $left"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS"
exit "$fail"
