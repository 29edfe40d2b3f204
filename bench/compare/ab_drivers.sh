#!/usr/bin/env bash
# Two builds of bench_compare_driver side by side: each case runs on driver A, then driver B, `--runs` times,
# alternating, on the checkpoints and inputs compare.py made (--cache, default ~/.cache/kiln-bench). Prints
# each run's median step seconds (and min-max) from both, and the ratio of their medians over the runs.
# Use it to show that a change is no slower: build the driver at the old commit in a worktree, e.g.
#   git worktree add /tmp/wt-old <commit> && cmake -S /tmp/wt-old -B /tmp/wt-old/build -DCMAKE_BUILD_TYPE=Release \
#       -DKILN_BUILD_BENCH=ON && cmake --build /tmp/wt-old/build --target bench_compare_driver
#   bench/compare/ab_drivers.sh build/bench/bench_compare_driver /tmp/wt-old/build/bench/bench_compare_driver \
#       flux:compile:512 sd3:eager:1024 t5:eager
# Cases are model:mode[:size] with model flux, sd3, t5, sd15 or sdxl (compare.py's default depths: flux-1+1,
# sd3-2, t5-2, sd15 in full, sdxl cut to transformer_layers_per_block [1, 2, 2]), mode eager, fuse, compile or
# compile-blocks, size 512 or 1024 (t5: its 512 tokens, no size), e.g. sd15:compile:512 sdxl:eager:1024.
# --tiny runs the drivers' tiny random models instead (--random --tiny, size 64; the tests use it), no cache.
set -euo pipefail
usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
  echo "usage: $0 DRIVER_A DRIVER_B [--runs N] [--cache DIR | --tiny] CASE..." >&2
  exit 2
}
[ $# -ge 3 ] || usage
a=$1 b=$2
shift 2
runs=3
cache=${HOME}/.cache/kiln-bench
tiny=false
cases=()
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    --cache) cache=${2:?--cache needs a folder}; shift 2 ;;
    --tiny) tiny=true; shift ;;
    *) cases+=("$1"); shift ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "ab_drivers.sh: --runs must be a positive number, got '$runs'" >&2; exit 2; }
for d in "$a" "$b"; do
  [ -x "$d" ] || { echo "ab_drivers.sh: '$d' is not an executable driver (build bench_compare_driver)" >&2; exit 2; }
done
[ ${#cases[@]} -gt 0 ] || usage

# The folder compare.py keeps a model's checkpoint and inputs in (its case_dir, at its default depths).
folder_of() {
  case $1 in
    flux) echo "$cache/flux-1+1" ;;
    sd3) echo "$cache/sd3-2" ;;
    t5) echo "$cache/t5-2" ;;
    sd15) echo "$cache/sd15" ;;
    sdxl) echo "$cache/sdxl-1+2+2" ;;
  esac
}

# One run: prints "median min max" of the step seconds.
run_once() {
  local driver=$1 model=$2 mode=$3 size=$4 folder
  folder=$(folder_of "$model")
  [ "$model" = t5 ] && size=512
  local source=(--checkpoint "$folder" --inputs "$folder/inputs-$size.safetensors")
  if $tiny; then source=(--random --tiny --size 64); fi
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=passive "$driver" --model "$model" --mode "$mode" \
      --steps 3 --matmul-reps 0 "${source[@]}" 2>&1 |
    python3 -c '
import json, sys
text = sys.stdin.read()
if "KILN_RESULT" not in text:
    sys.exit("ab_drivers.sh: the driver printed no KILN_RESULT:\n" + text[-2000:])
r = json.loads(text.split("KILN_RESULT", 1)[1].splitlines()[0])
print(r["median_s"], r["min_s"], r["max_s"])'
}

for c in "${cases[@]}"; do
  IFS=: read -r model mode size <<<"$c"
  case $model in flux | sd3 | t5 | sd15 | sdxl) ;; *) echo "ab_drivers.sh: unknown model in '$c' (expected flux, sd3, t5, sd15 or sdxl)" >&2; exit 2 ;; esac
  case $mode in eager | fuse | compile | compile-blocks) ;; *) echo "ab_drivers.sh: unknown mode in '$c' (expected eager, fuse, compile or compile-blocks)" >&2; exit 2 ;; esac
  if [ "$model" != t5 ]; then
    case ${size:-} in 512 | 1024) ;; *) echo "ab_drivers.sh: '$c' needs a size, 512 or 1024" >&2; exit 2 ;; esac
    $tiny || [ -f "$(folder_of "$model")/inputs-$size.safetensors" ] ||
      { echo "ab_drivers.sh: no inputs for '$c' under $cache (run compare.py --prepare-only first)" >&2; exit 2; }
  fi
  medians_a=() medians_b=()
  for ((i = 1; i <= runs; i++)); do
    ra=$(run_once "$a" "$model" "$mode" "${size:-512}")
    rb=$(run_once "$b" "$model" "$mode" "${size:-512}")
    read -r ma mina maxa <<<"$ra"
    read -r mb minb maxb <<<"$rb"
    medians_a+=("$ma") medians_b+=("$mb")
    printf '%s run %d: A %.3f s (%.3f-%.3f) | B %.3f s (%.3f-%.3f)\n' "$c" "$i" "$ma" "$mina" "$maxa" "$mb" "$minb" "$maxb"
  done
  python3 -c '
import statistics, sys
a = [float(x) for x in sys.argv[2].split()]
b = [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
ratio = f"{ma / mb:.2f}" if mb > 0 else "-"
print(f"{sys.argv[1]}: median of the runs A {ma:.3f} s, B {mb:.3f} s, A / B {ratio}")' \
    "$c" "${medians_a[*]}" "${medians_b[*]}"
done
