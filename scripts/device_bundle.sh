#!/usr/bin/env bash
# Prebuilt binaries for scripts/device_check.sh, for a GPU machine that cannot build Kiln: the ones lent to this
# project have a compiler and CMake but no oneDNN, OpenMPI, libpng or nlohmann-json, and no network to fetch
# them. This builds the check's programs here, copies them with every shared library they load beyond glibc and
# the C++ runtime (which any newer Linux has) into one archive, and `device_check.sh --bundle ARCHIVE` there
# unpacks it in place of its build (docs/devices.md, "Checking a GPU").
#
#   scripts/device_bundle.sh [--build-dir DIR] [--no-build] [--jobs N] [--output FILE] [--fast]
#
# --build-dir: where to configure and build (default build-bundle); --no-build: package what DIR already holds
# (an existing test build, as the ctest dry run does); --output: the archive (default
# build-device/device-bundle.tar.xz, ignored by git: name it in the device tool's `carry`, whose limit is 64 MiB
# with the checkout; the archive is ~18 MB); --fast: compress quickly into a larger archive.
# The archive holds the build's layout (kiln, tests/kiln_test_pjrt, tests/kiln_test_devices,
# tests/libkiln_fake_pjrt_plugin.so, bench/bench_device_step), lib/ with the libraries, and BUNDLE saying which
# commit and host built it. The tests read tests/data from the checkout they run beside ($KILN_TEST_DATA_DIR),
# so run it beside the same commit.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
source scripts/lib/find_pjrt_header.sh

build=build-bundle
output=build-device/device-bundle.tar.xz
jobs="$(nproc)"
do_build=1
level=-6
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --fast) level=-1; shift ;;
    *) echo "device_bundle: unknown argument $1 (see the comment at the top of $0)" >&2; exit 2 ;;
  esac
done

targets=(kiln_cli kiln_test_pjrt kiln_test_devices kiln_fake_pjrt_plugin bench_device_step)
files=(kiln tests/kiln_test_pjrt tests/kiln_test_devices tests/libkiln_fake_pjrt_plugin.so bench/bench_device_step)

if [ $do_build -eq 1 ]; then
  header="$(find_pjrt_header "$root")" || {
    echo "device_bundle: no PJRT C header: run scripts/fetch_pjrt.sh (or ./scripts/setup.sh --pjrt) first" >&2
    exit 1
  }
  export CCACHE_BASEDIR="$root"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=ON \
    -DKILN_PJRT_INCLUDE_DIR="$header" >/dev/null
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
fi
for f in "${files[@]}"; do
  [ -f "$build/$f" ] || {
    echo "device_bundle: $build/$f is missing (configure with the PJRT header, tests and benchmarks on)" >&2
    exit 1
  }
done

stage="$(mktemp -d)"
trap 'rm -rf "$stage" "${output}.partial"' EXIT
for f in "${files[@]}"; do
  mkdir -p "$stage/$(dirname "$f")"
  strip --strip-unneeded -o "$stage/$f" "$build/$f"
done

# Every library the programs load, except glibc's own and the C++ runtime: those a machine's own newer
# versions serve (the programs need GLIBC and GLIBCXX no newer than this host's), and a plugin loaded into the
# process (the CUDA plugin) must share the machine's C++ runtime.
mkdir -p "$stage/lib"
system_lib='^(linux-vdso|ld-linux.*|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)\.so'
for f in "${files[@]}"; do
  ldd "$build/$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ "$name" =~ $system_lib ]] && continue
  cp -L "$path" "$stage/lib/$name"
done

{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- src include cli tests bench 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"'),"
  echo "  CPU $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(ldd --version | head -1)"
  echo "libraries: $(ls "$stage/lib" | tr '\n' ' ')"
} >"$stage/BUNDLE"

mkdir -p "$(dirname "$output")"
tmp="$output.partial"
tar -C "$stage" -cf - . | xz -T0 "$level" >"$tmp"
mv "$tmp" "$output"
echo "device_bundle: $output, $(du -m "$output" | cut -f1) MB ($(du -sm "$stage" | cut -f1) MB unpacked)"
sed 's/^/  /' "$stage/BUNDLE"
