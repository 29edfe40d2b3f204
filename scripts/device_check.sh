#!/usr/bin/env bash
# One prepared run on a machine with an NVIDIA GPU (docs/devices.md, "Checking a GPU"): build with PJRT, run the
# PJRT and device test suites on the cuda device, compare the tiny pipelines' images on cuda with the CPU's,
# and time a FLUX-shaped and an SD3-shaped transformer step in Kiln (strict eager and compiled) against
# PyTorch eager and torch.compile on the same GPU, ending with one table. Installs nothing and reaches no
# network: it says what is missing. Each stage has a time box, so the whole stays under ~9 minutes on a
# 16-core H200 machine.
#
#   scripts/device_check.sh [--device cuda|xla-cpu] [--quick] [--jobs N] [--build-dir DIR]
#
# --device xla-cpu --quick is the dry run this (GPU-less) host can do: every stage, on the CPU plugin, with
# small shapes and a test subset (ctest runs it: scripts.device_check_dry_run).
#
# What it needs, found or reported:
#   - the PJRT C header: $KILN_PJRT_INCLUDE_DIR, else build-device/pjrt/include in the checkout (carry it there
#     from a machine that ran scripts/fetch_pjrt.sh: cp -r ~/.cache/kiln/pjrt/include build-device/pjrt/),
#     else Kiln's cache (~/.cache/kiln/pjrt/include), else scripts/fetch_pjrt.sh if the network allows;
#   - for cuda: the jax-cuda13-pjrt plugin (Kiln's locator finds it; $KILN_PJRT_PLUGIN overrides) and the
#     nvidia-* wheels' lib folders, which this script puts on LD_LIBRARY_PATH; torch with CUDA for the timings;
#   - the xla-cpu plugin is optional: the images are compared with Kiln's cpu backend, and with xla-cpu too
#     when its plugin is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

device=cuda
quick=0
jobs="$(nproc)"
build=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    *) echo "device_check: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
case "$device" in cuda | xla-cpu) ;; *) echo "device_check: --device must be cuda or xla-cpu" >&2; exit 2 ;; esac
build="${build:-build-device}"
mkdir -p "$build"
out="$build/device_check"
rm -rf "$out"
mkdir -p "$out"
python="${PYTHON:-python3}"
started=$SECONDS
declare -a summary=()
note() { summary+=("$1"); echo "== $1"; }

# Runs "$@" under a time box of $1 seconds, its output in $out/$2.log; returns its status (124: timed out).
boxed() {
  local limit="$1" name="$2"
  shift 2
  local t0=$SECONDS rc
  # Through bash, so that the exported shell functions below (configure, gen) can be boxed too.
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "   ($name: exit $rc in $((SECONDS - t0)) s; log $out/$name.log)"
  [ $rc -eq 124 ] && echo "   $name ran past its ${limit} s box"
  return $rc
}

# ---- 1. what is installed
missing=()
have_torch=0
if "$python" -c "import torch" 2>/dev/null; then
  have_torch=1
  torch_info="$("$python" -c "import torch; print(torch.__version__, 'cuda' if torch.cuda.is_available() else 'no-cuda')")"
else
  missing+=("torch (PyTorch timings skipped)")
fi
if [ "$device" = cuda ]; then
  "$python" -c "import jax_plugins.xla_cuda13" 2>/dev/null || missing+=("jax-cuda13-pjrt (the cuda plugin)")
  "$python" -c "import nanobind" 2>/dev/null || missing+=("nanobind (the Python package is not built here)")
  # The CUDA plugin loads cuDNN, cuBLAS and the CUDA runtime from the nvidia-* wheels' lib folders.
  nvlibs="$("$python" - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for base in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib")))
print(":".join(dirs))
PY
)"
  [ -n "$nvlibs" ] && export LD_LIBRARY_PATH="$nvlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  command -v nvidia-smi >/dev/null && gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
fi
echo "device_check: device $device, quick $quick, ${jobs} jobs; torch ${torch_info:-absent}; GPU ${gpu_name:-none seen}"
for m in "${missing[@]}"; do note "missing: $m"; done

# ---- 2. the PJRT header, then configure and build
header=""
for dir in "${KILN_PJRT_INCLUDE_DIR:-}" "$root/build-device/pjrt/include" \
  "${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/pjrt/include"; do
  if [ -n "$dir" ] && [ -f "$dir/xla/pjrt/c/pjrt_c_api.h" ]; then header="$dir"; break; fi
done
if [ -z "$header" ]; then
  echo "device_check: no PJRT header found; trying scripts/fetch_pjrt.sh (needs PyPI)"
  if boxed 120 fetch_pjrt scripts/fetch_pjrt.sh; then
    header="${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/pjrt/include"
  else
    note "FAIL: no PJRT C header (carry ~/.cache/kiln/pjrt/include into build-device/pjrt/include, or set KILN_PJRT_INCLUDE_DIR)"
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
fi
echo "device_check: PJRT header from $header"
export CCACHE_BASEDIR="$root"
configure() {
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH="$1" \
    -DKILN_PJRT_INCLUDE_DIR="$header"
}
export -f configure
export build header
bench_built=1
if ! boxed 120 configure configure ON; then
  bench_built=0  # Google Benchmark absent: build without the benchmarks, the Kiln timings are skipped
  boxed 120 configure configure OFF || { note "FAIL: configure (see $out/configure.log)"; printf '%s\n' "${summary[@]}"; exit 1; }
fi
targets=(kiln_cli kiln_test_pjrt kiln_test_devices)
[ $bench_built -eq 1 ] && targets+=(bench_device_step)
if ! boxed 300 build cmake --build "$build" -j "$jobs" --target "${targets[@]}"; then
  note "FAIL: build (see $out/build.log)"
  printf '%s\n' "${summary[@]}"
  exit 1
fi
note "build: ok in $((SECONDS - started)) s"

# ---- 3. the PJRT and device tests on the device
export KILN_TEST_DEVICE="$device"
filter="*"
[ $quick -eq 1 ] && filter="CudnnAttention*:StableHloOps*Attention*:PjrtModes*"
for suite in pjrt devices; do
  boxed $([ $quick -eq 1 ] && echo 120 || echo 150) "test_$suite" \
    "$build/tests/kiln_test_$suite" --gtest_filter="$filter" --gtest_brief=1
  result="$(grep -E '^\[  (PASSED|FAILED)  \]|tests? ran' "$out/test_$suite.log" | tr '\n' ' ')"
  note "tests/$suite on $device: ${result:-no summary (see the log)}"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$out/test_$suite.log" | sed 's/^/     /' | head -20
done

# ---- 4. the tiny pipelines' images on the device against the cpu backend (and xla-cpu when installed)
size=32
kiln="$build/kiln"
gen() {  # model dtype device mode output
  "$kiln" generate --model "tests/data/models/$1" --dtype "$2" --device "$3" --mode "$4" --prompt "a red circle" \
    --height $size --width $size --steps 2 --seed 1 --max-sequence-length 16 --output "$5"
}
export -f gen
export size kiln
others=(cpu)
[ "$device" != xla-cpu ] && "$kiln" info --devices 2>/dev/null | grep -q '^xla-cpu: [0-9]' && others+=(xla-cpu)
images=("flux-tiny-schnell f32" "flux-tiny-dev-bf16 bf16" "sd3-tiny-medium bf16")
[ $quick -eq 1 ] && images=("flux-tiny-dev-bf16 bf16")
for spec in "${images[@]}"; do
  read -r model dtype <<<"$spec"
  for mode in eager compile; do
    mine="$out/${model}_${device}_${mode}.png"
    if ! boxed 120 "image_${model}_${mode}" gen "$model" "$dtype" "$device" "$mode" "$mine"; then
      note "image $model $dtype $mode on $device: FAILED (see the log)"
      continue
    fi
    for other in "${others[@]}"; do
      ref="$out/${model}_${other}.png"
      [ -f "$ref" ] || boxed 120 "image_${model}_${other}" gen "$model" "$dtype" "$other" eager "$ref" >/dev/null
      note "image $model $dtype $mode: $device vs $other: $("$python" bench/image_diff.py "$mine" "$ref" 2>&1)"
    done
  done
done

# ---- 5. timings: Kiln (strict eager, compiled) against PyTorch (eager, torch.compile), same shapes
reps=5
tsize=1024
[ $quick -eq 1 ] && reps=1 && tsize=128
torch_device="$device"
[ "$device" = xla-cpu ] && torch_device=cpu
for model in flux sd3; do
  [ $bench_built -eq 1 ] && boxed 240 "kiln_$model" "$build/bench/bench_device_step" "$model" "$device" $reps $tsize
  if [ $have_torch -eq 1 ]; then
    modes="eager,compile"
    [ $quick -eq 1 ] && modes=eager
    boxed 240 "torch_$model" "$python" bench/torch_step.py "$model" --device "$torch_device" --reps $reps \
      --size $tsize --modes "$modes"
  fi
done
"$python" - "$out" "$device" "${gpu_name:-}" <<'PY' | tee "$out/table.txt"
import glob, os, sys
out, device, gpu = sys.argv[1], sys.argv[2], sys.argv[3]
r = {}
for log in glob.glob(os.path.join(out, "*.log")):
    for line in open(log, errors="replace"):
        if line.startswith("DEVICE ") and not gpu:
            gpu = line.split(" ", 1)[1].strip()
        if line.startswith("RESULT "):
            _, who, model, mode, ms, *rest = line.split()
            r[(who, model, mode)] = (float(ms), rest[0] if rest else "")
print(f"\nTransformer step on {device} ({gpu or 'no GPU name'}), bf16, best of the timed calls, ms:")
print(f"{'model':6} {'kiln eager':>11} {'torch eager':>12} {'ratio':>6}   {'kiln compiled':>14} {'torch.compile':>14} {'ratio':>6}")
def cell(k):
    return f"{r[k][0]:.2f}" if k in r else "-"
def ratio(a, b):
    return f"{r[a][0] / r[b][0]:.2f}" if a in r and b in r else "-"
for m in ("flux", "sd3"):
    e, te, c, tc = ("kiln", m, "eager"), ("torch", m, "eager"), ("kiln", m, "compiled"), ("torch", m, "compile")
    print(f"{m:6} {cell(e):>11} {cell(te):>12} {ratio(e, te):>6}   {cell(c):>14} {cell(tc):>14} {ratio(c, tc):>6}")
print("ratio = Kiln / PyTorch (aims: compiled <= 1.0 against torch.compile, strict eager <= 1.5 against eager).")
print("First calls (compiling included): " + ", ".join(f"{w} {m} {mo} {v[1].split('=')[-1]} ms" for (w, m, mo), v in sorted(r.items())))
PY

echo
echo "device_check summary ($((SECONDS - started)) s):"
printf '  %s\n' "${summary[@]}"
