#!/usr/bin/env bash
# One prepared run on a machine with an NVIDIA GPU (docs/devices.md, "Checking a GPU"): build with PJRT (or unpack
# the binaries scripts/device_bundle.sh built elsewhere), run the PJRT and device test suites on the cuda device,
# compare the tiny pipelines' images on cuda with the CPU's, and time a FLUX-shaped and an SD3-shaped transformer
# step in Kiln (strict eager and compiled) against PyTorch eager and torch.compile on the same GPU, ending with one
# table. Installs nothing and reaches no network: it says what is missing. Each stage has a time box, so the whole
# stays under ~9 minutes on a 16-core H200 machine.
#
#   scripts/device_check.sh [--device cuda|xla-cpu] [--quick] [--jobs N] [--build-dir DIR] [--bundle ARCHIVE]
#                           [--budget SECONDS]
#
# --device xla-cpu --quick is the dry run this (GPU-less) host can do: every stage, on the CPU plugin, with
# small shapes and a test subset (ctest runs it from a bundle of the test build: scripts.device_check_bundle).
# --bundle: use device_bundle.sh's archive instead of building (the GPU machines lent to this project have no
# oneDNN, OpenMPI, libpng or nlohmann-json to build with); it unpacks into the build folder, its libraries go on
# LD_LIBRARY_PATH, and the tests read tests/data from this checkout. --budget: the whole run's wall-clock limit
# (the device tool's command limit is 600 s): each stage's time box shrinks to fit what is left, later stages are
# skipped and said to be; findings are written to build-device/device_check/summary.txt as they come.
#
# What it needs, found or reported:
#   - to build: the PJRT C header: $KILN_PJRT_INCLUDE_DIR, else build-device/pjrt/include in the checkout (carry
#     it there from a machine that ran scripts/fetch_pjrt.sh: cp -r ~/.cache/kiln/pjrt/include build-device/pjrt/),
#     else Kiln's cache (~/.cache/kiln/pjrt/include), else scripts/fetch_pjrt.sh if the network allows;
#   - for cuda: the jax-cuda13-pjrt plugin (Kiln's locator finds it; $KILN_PJRT_PLUGIN overrides) and the
#     nvidia-* wheels' lib folders, which this script puts on LD_LIBRARY_PATH; torch with CUDA for the timings;
#   - the xla-cpu plugin is optional: the images are compared with Kiln's cpu backend, and with xla-cpu too
#     when its plugin is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
source scripts/lib/find_pjrt_header.sh

device=cuda
quick=0
jobs="$(nproc)"
build=""
bundle=""
budget=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    --bundle) bundle="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    *) echo "device_check: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done
case "$device" in cuda | xla-cpu) ;; *) echo "device_check: --device must be cuda or xla-cpu" >&2; exit 2 ;; esac
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "device_check: --budget takes whole seconds, got '$budget'" >&2; exit 2; }
if [ -n "$bundle" ]; then
  [ -f "$bundle" ] || { echo "device_check: --bundle $bundle: no such file (make it with scripts/device_bundle.sh)" >&2; exit 2; }
  bundle="$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")"
fi
build="${build:-build-device}"
mkdir -p "$build"
build="$(cd "$build" && pwd)"
out="$build/device_check"
rm -rf "$out"
mkdir -p "$out"
python="${PYTHON:-python3}"
started=$SECONDS
declare -a summary=()
# Each finding, printed, kept for the closing summary and written at once to $out/summary.txt (a run stopped
# from outside keeps what it found).
note() { summary+=("$1"); echo "== $1"; echo "$1" >>"$out/summary.txt"; }

# Runs "$@" under a time box of $1 seconds, its output in $out/$2.log; returns its status (124: timed out).
# Under --budget, a box shrinks to what is left of it, and a stage with under 20 s left is skipped (125).
boxed() {
  local limit="$1" name="$2"
  shift 2
  if [ "$budget" -gt 0 ]; then
    local left=$((budget - (SECONDS - started) - 10))
    if [ $left -lt 20 ]; then
      note "skipped $name: the --budget of $budget s is spent"
      return 125
    fi
    [ $left -lt "$limit" ] && limit=$left
  fi
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
  # Kiln's locator searches the Python on PATH; the folder Python itself reports is named too, for Pythons
  # elsewhere.
  # (Found without importing it: its __init__ imports jax.)
  plugin_dir="$("$python" -c 'import importlib.util as u
print(list(u.find_spec("jax_plugins.xla_cuda13").submodule_search_locations)[0])' 2>/dev/null)"
  if [ -z "$plugin_dir" ]; then
    missing+=("jax-cuda13-pjrt (the cuda plugin)")
  elif [ -z "${KILN_PJRT_PLUGIN:-}${KILN_PJRT_PLUGIN_DIR:-}" ]; then
    export KILN_PJRT_PLUGIN_DIR="$plugin_dir"
  fi
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

# ---- 2. the programs: unpacked from a bundle, or configured and built here
# The programs' folder, laid out as a build folder: $build, or $build/bundle.
bin="$build"
# Runs one of Kiln's programs with the bundle's libraries first on its library path (only Kiln's: Python and
# torch keep the machine's own).
bundle_libs=""
with_libs() {
  if [ -n "$bundle_libs" ]; then LD_LIBRARY_PATH="$bundle_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; else "$@"; fi
}
export -f with_libs
# Unpacks $bundle into $bin and points the programs at its libraries and at this checkout's test data.
use_bundle() {
  rm -rf "$bin"
  mkdir -p "$bin"
  if command -v xz >/dev/null; then
    tar -C "$bin" -xJf "$bundle" || return 1
  else
    "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$bin" ||
      return 1
  fi
  bundle_libs="$bin/lib"
  export bundle_libs
  export KILN_TEST_DATA_DIR="$root/tests/data" KILN_FAKE_PJRT_PLUGIN="$bin/tests/libkiln_fake_pjrt_plugin.so"
  sed 's/^/   /' "$bin/BUNDLE"
  with_libs ldd "$bin/kiln" >"$out/ldd.log" 2>&1
  local unresolved
  unresolved="$(for f in "$bin/kiln" "$bin"/tests/kiln_test_* "$bin"/bench/*; do with_libs ldd "$f"; done |
    awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')"
  if [ -n "$unresolved" ]; then
    echo "   libraries neither in the bundle nor on this machine: $unresolved"
    return 1
  fi
}
bench_built=1
if [ -n "$bundle" ]; then
  bin="$build/bundle"
  if ! use_bundle; then
    note "FAIL: the bundle $bundle does not run here (see above)"
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
  [ -x "$bin/bench/bench_device_step" ] || bench_built=0
  note "programs: from the bundle ($(sed -n 's/^commit //p' "$bin/BUNDLE"))"
else
  if ! header="$(find_pjrt_header "$root")"; then
    echo "device_check: no PJRT header found; trying scripts/fetch_pjrt.sh (needs PyPI)"
    if boxed 120 fetch_pjrt scripts/fetch_pjrt.sh; then
      header="$(find_pjrt_header "$root")"
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
  if ! boxed 120 configure configure ON; then
    bench_built=0  # Google Benchmark absent: build without the benchmarks, the Kiln timings are skipped
    if ! boxed 120 configure configure OFF; then
      note "FAIL: configure (see $out/configure.log; a machine without Kiln's build dependencies can run a bundle: scripts/device_bundle.sh)"
      printf '%s\n' "${summary[@]}"
      exit 1
    fi
  fi
  targets=(kiln_cli kiln_test_pjrt kiln_test_devices)
  [ $bench_built -eq 1 ] && targets+=(bench_device_step)
  if ! boxed 300 build cmake --build "$build" -j "$jobs" --target "${targets[@]}"; then
    note "FAIL: build (see $out/build.log)"
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
  note "build: ok in $((SECONDS - started)) s"
fi

with_libs "$bin/kiln" info --devices >"$out/devices.log" 2>&1
note "kiln info --devices: $(grep -E "^$device: " "$out/devices.log" | cut -c1-200)"
# The first device's memory as its plugin reports it: what --offload auto plans for.
note "$device:0 $(grep -A1 -E "^  $device:0 " "$out/devices.log" | sed -n '2s/^ *//p' | cut -c1-200)"
grep -E "^  $device:0 " "$out/devices.log" | sed 's/^/     /'

# ---- 3. the tiny pipelines' images on the device against the cpu backend (and xla-cpu when installed)
size=32
kiln="$bin/kiln"
gen() {  # model dtype device mode output
  with_libs "$kiln" generate --model "tests/data/models/$1" --dtype "$2" --device "$3" --mode "$4" --prompt "a red circle" \
    --height $size --width $size --steps 2 --seed 1 --max-sequence-length 16 --output "$5"
}
export -f gen
export size kiln
others=(cpu)
[ "$device" != xla-cpu ] && with_libs "$kiln" info --devices 2>/dev/null | grep -q '^xla-cpu: [0-9]' && others+=(xla-cpu)
images=("flux-tiny-schnell f32" "flux-tiny-dev-bf16 bf16" "sd3-tiny-medium bf16")
[ $quick -eq 1 ] && images=("flux-tiny-dev-bf16 bf16")
# Cuda's attention is cuDNN's fused call unless KILN_PJRT_FUSED_ATTENTION=0: a run that fails on cuda is made
# again with the composition, so that one run tells a cuDNN failure from any other.
composed_retry=0
[ "$device" = cuda ] && [ -z "${KILN_PJRT_FUSED_ATTENTION:-}" ] && composed_retry=1
# A log's first error: Kiln's own line, else an exception's, else any line saying error (the plugin's log).
first_error() {
  { grep -m1 -E '^(kiln|bench_device_step): error|what\(\)|Error: ' "$out/$1.log" ||
    grep -m1 -i 'error' "$out/$1.log"; } 2>/dev/null | cut -c1-200
}
# Notes that a box failed ("WHAT: FAILED: why"), given its status and name; nothing for a skipped one (boxed
# noted it).
note_failure() {  # status what name
  case "$1" in
    125) ;;
    124 | 137) note "$2: FAILED: ran past its time box" ;;
    *) note "$2: FAILED: $(first_error "$3")" ;;
  esac
}
# Generates one image on the device (name suffix $5: "" or "_composed") and compares it with the others.
image_on_device() {  # model dtype mode label suffix
  local model="$1" dtype="$2" mode="$3" label="$4" suffix="$5" mine="$out/$1_${device}_$3$5.png"
  boxed 120 "image_${model}_${mode}${suffix}" gen "$model" "$dtype" "$device" "$mode" "$mine" || return $?
  for other in "${others[@]}"; do
    ref="$out/${model}_${other}.png"
    if [ ! -f "$ref" ] && ! boxed 120 "image_${model}_${other}" gen "$model" "$dtype" "$other" eager "$ref" >/dev/null; then
      note_failure $? "reference image $model on $other" "image_${model}_${other}"
      continue
    fi
    note "image $model $dtype $mode$label: $device vs $other: $("$python" bench/image_diff.py "$mine" "$ref" 2>&1)"
  done
}
for spec in "${images[@]}"; do
  read -r model dtype <<<"$spec"
  for mode in eager compile; do
    image_on_device "$model" "$dtype" "$mode" "" ""
    rc=$?
    [ $rc -eq 0 ] && continue
    note_failure $rc "image $model $dtype $mode on $device" "image_${model}_${mode}"
    [ $rc -ne 125 ] && [ $composed_retry -eq 1 ] || continue
    export KILN_PJRT_FUSED_ATTENTION=0
    image_on_device "$model" "$dtype" "$mode" " (composed attention)" _composed ||
      note_failure $? "image $model $dtype $mode on $device with composed attention" "image_${model}_${mode}_composed"
    unset KILN_PJRT_FUSED_ATTENTION
  done
done

# ---- 4. timings: Kiln (strict eager, compiled) against PyTorch (eager, torch.compile), same shapes
reps=5
tsize=1024
[ $quick -eq 1 ] && reps=1 && tsize=128
torch_device="$device"
[ "$device" = xla-cpu ] && torch_device=cpu
for model in flux sd3; do
  if [ $bench_built -eq 1 ]; then
    boxed 240 "kiln_$model" with_libs "$bin/bench/bench_device_step" "$model" "$device" $reps $tsize
    rc=$?
    [ $rc -eq 0 ] || note_failure $rc "kiln $model step on $device" "kiln_$model"
    if [ $rc -ne 0 ] && [ $rc -ne 125 ] && [ $composed_retry -eq 1 ]; then
      export KILN_PJRT_FUSED_ATTENTION=0
      if boxed 240 "kiln_${model}_composed" with_libs "$bin/bench/bench_device_step" "$model" "$device" $reps $tsize; then
        note "kiln $model step on $device: timed with composed attention (KILN_PJRT_FUSED_ATTENTION=0)"
      else
        note_failure $? "kiln $model step on $device with composed attention" "kiln_${model}_composed"
      fi
      unset KILN_PJRT_FUSED_ATTENTION
    fi
  fi
  if [ $have_torch -eq 1 ]; then
    modes="eager,compile"
    [ $quick -eq 1 ] && modes=eager
    boxed 240 "torch_$model" "$python" bench/torch_step.py "$model" --device "$torch_device" --reps $reps \
      --size $tsize --modes "$modes" || note_failure $? "torch $model step on $torch_device" "torch_$model"
  fi
done
"$python" - "$out" "$device" "${gpu_name:-}" <<'PY' | tee "$out/table.txt"
import glob, os, sys
out, device, gpu = sys.argv[1], sys.argv[2], sys.argv[3]
r, mem = {}, {}
for log in glob.glob(os.path.join(out, "*.log")):
    for line in open(log, errors="replace"):
        if line.startswith("DEVICE ") and not gpu:
            gpu = line.split(" ", 1)[1].strip()
        if line.startswith("RESULT "):
            _, who, model, mode, ms, *rest = line.split()
            r[(who, model, mode)] = (float(ms), rest[0] if rest else "")
        if line.startswith("MEMORY "):
            _, who, model, mode, *fields = line.split()
            for f in fields:
                key, _, value = f.partition("=")
                mem[(who, model, "compiled" if mode == "compile" else mode, key)] = int(value)
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
if mem:
    # Kiln counts its arrays and, while a program runs, the program's scratch (XLA's temporaries).
    print(f"\nActivations held during the timed calls, MiB (Kiln: arrays and programs' scratch; torch: allocated):")
    print(f"{'model':6} {'mode':9} {'kiln':>9} {'torch':>9} {'kiln budget estimate':>21}")
    def mib(k):
        return f"{mem[k] / 2**20:.1f}" if k in mem else "-"
    for m in ("flux", "sd3"):
        for mo in ("eager", "compiled"):
            print(f"{m:6} {mo:9} {mib(('kiln', m, mo, 'activations')):>9} {mib(('torch', m, mo, 'activations')):>9} "
                  f"{mib(('kiln', m, mo, 'estimate')):>21}")
PY

# ---- 5. the PJRT and device test suites on the device (last: they take what the budget leaves)
export KILN_TEST_DEVICE="$device"
filter="*"
[ $quick -eq 1 ] && filter="CudnnAttention*:StableHloOps*Attention*:PjrtModes*"
for suite in pjrt devices; do
  boxed $([ $quick -eq 1 ] && echo 120 || echo 150) "test_$suite" \
    with_libs "$bin/tests/kiln_test_$suite" --gtest_filter="$filter" --gtest_brief=1
  rc=$?
  [ $rc -eq 125 ] && continue
  log="$out/test_$suite.log"
  passed="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$log")"
  skipped="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?\..*/\1/p' "$log")"
  failed="$(grep -cE '^\[  FAILED  \] [A-Za-z]' "$log")"
  if [ -z "$passed" ]; then
    note "tests/$suite on $device: no summary (exit $rc; $failed failed before it stopped; see the log)"
  else
    note "tests/$suite on $device: $passed passed, $failed failed, ${skipped:-0} skipped"
  fi
  grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sed 's/^/     /' | head -20
done

echo
echo "device_check summary ($((SECONDS - started)) s):"
printf '  %s\n' "${summary[@]}"
