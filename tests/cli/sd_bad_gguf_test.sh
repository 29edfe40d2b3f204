#!/bin/sh
# Bad GGUF files given to kiln generate as an SD model (--model FILE --config FOLDER): a truncated file, a quant
# type Kiln does not read (IQ4_NL in one tensor's info), another family's GGUF. Each is refused with an error
# naming the file and what is wrong, exit status 1, before any step runs, and no output file is written.
# usage: sd_bad_gguf_test.sh KILN DATA_DIR WORKDIR
set -u
kiln=$1 data=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
good=$data/goldens/sd_quantized/sd15_tiny_q8_0.gguf
size=$(wc -c < "$good")
head -c $((size - 1000)) "$good" > "$work/cut.gguf"
cp "$good" "$work/iq4_nl.gguf"
tensor=model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight
at=$(grep -obUaF "$tensor" "$good" | head -n 1 | cut -d: -f1)
# The name, the dimension count (uint32, 2), two uint64 dimensions, then the type id (uint32): IQ4_NL is 20.
printf '\024' | dd of="$work/iq4_nl.gguf" bs=1 seek=$((at + ${#tensor} + 4 + 16)) conv=notrunc 2>/dev/null
fail=0
check() {  # FILE EXPECTED-MESSAGE
  out=$work/$(basename "$1").png
  { "$kiln" generate --model "$1" --config "$data/models/sd15-tiny" --prompt "a cat" --height 64 --width 64 \
        --steps 2 --seed 0 --output "$out" 2>&1; echo "exit status $?"; } > "$work/log"
  cat "$work/log"
  grep -q "exit status 1$" "$work/log" || { echo "FAIL: $1: expected exit status 1"; fail=1; }
  grep -qF "$2" "$work/log" || { echo "FAIL: $1: no error saying: $2"; fail=1; }
  if grep -q "denoising" "$work/log"; then echo "FAIL: $1: steps ran"; fail=1; fi
  [ ! -e "$out" ] || { echo "FAIL: $1: an output file was written"; fail=1; }
}
check "$work/cut.gguf" "file truncated?"
check "$work/iq4_nl.gguf" "iq4_nl.gguf: tensor '$tensor': unsupported ggml type id 20"
check "$data/gguf/flux-tiny-dev-Q8_0.gguf" "flux-tiny-dev-Q8_0.gguf: not a whole pipeline in one file"
[ "$fail" -eq 0 ] && echo "PASS"
exit "$fail"
