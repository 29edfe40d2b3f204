#!/usr/bin/env bash
# Fetches what Kiln's PJRT backend builds and tests with, from PyPI at pinned versions and sha256:
#   - the PJRT C API header (xla/pjrt/c/*.h), taken from the tensorflow-cpu wheel, which carries XLA's include
#     folder (PJRT API 0.90). Only those headers are extracted; they are never copied into the git tree.
#   - the CPU test plugin lammps-jax-pjrt-cpu (pjrt_c_api_cpu_plugin.so, built from jaxlib 0.11.2's XLA).
# With --cross, also the compilers of the devices CI does not have, for KILN_PJRT_CROSS_COMPILE
# (src/backends/pjrt/cross_targets.h): libtpu 0.0.52 (libtpu.so; Google Cloud's terms, so it is fetched from
# PyPI, never shipped) and jax-cuda13-pjrt 0.11.2 (xla_cuda_plugin.so), into <cache>/pjrt/cross/, where only
# cross-compiling looks (`--device tpu|cuda` still needs a real install on a TPU VM or GPU machine).
# The header and the CPU plugin land in ${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/pjrt/ (include/ and lib/), where CMake
# (KILN_PJRT_INCLUDE_DIR) and kiln::pjrt::find_plugin("xla-cpu") look. Re-running does nothing once both are
# extracted from the pinned wheels.
#
# KILN_WHEEL_DIR: folders (separated by ':') that may already hold the wheels (same file names); used when their sha256 matches,
# so a developer need not download the 274 MB tensorflow wheel again. Otherwise pip downloads them.
# pip is told the target platform and Python version, so this works whatever the local Python is.
set -euo pipefail

cross=false
for arg in "$@"; do
  case "$arg" in
    --cross) cross=true ;;
    *) echo "fetch_pjrt: unknown option $arg (expected --cross)" >&2; exit 2 ;;
  esac
done

cache="${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/pjrt"

plugin_req="lammps-jax-pjrt-cpu==0.11.2"
plugin_wheel="lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl"
plugin_sha="1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1"
plugin_member="lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"

tpu_req="libtpu==0.0.52"
tpu_wheel="libtpu-0.0.52-cp311-cp311-manylinux_2_31_x86_64.whl"
tpu_sha="f5e2e596eaea9357fbb5a6755a7a9007c6ab75bfde4a55191b03eff402971140"
tpu_member="libtpu/libtpu.so"

cuda_req="jax-cuda13-pjrt==0.11.2"
cuda_wheel="jax_cuda13_pjrt-0.11.2-py3-none-manylinux_2_27_x86_64.whl"
cuda_sha="e5ff589d43064913bb74027682d89639c7ea48f9f81c2bae6fc75117e913f93e"
cuda_member="jax_plugins/xla_cuda13/xla_cuda_plugin.so"

header_req="tensorflow-cpu==2.21.0"
header_wheel="tensorflow_cpu-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl"
header_sha="2b847d217b02ee7731ed91431daf3250daa0196c3c94614d23be27232e6e5b6c"
header_prefix="tensorflow/include/"  # members under tensorflow/include/xla/pjrt/c/ keep their xla/... path

mkdir -p "$cache"
work="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Puts the wheel $1 (requirement $2, sha256 $3; platform tag $4, manylinux_2_27 unless given) in $work and
# prints its path; refuses a wrong sha256.
get_wheel() {
  local name="$1" req="$2" sha="$3" platform="${4:-manylinux_2_27_x86_64}" path="" dir
  local -a dirs=()
  [ -z "${KILN_WHEEL_DIR:-}" ] || IFS=: read -r -a dirs <<<"$KILN_WHEEL_DIR"
  for dir in "${dirs[@]}"; do
    if [ -f "$dir/$name" ]; then path="$dir/$name"; break; fi
  done
  if [ -n "$path" ]; then
    echo "fetch_pjrt: using $path" >&2
  else
    echo "fetch_pjrt: downloading $req" >&2
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.11 --platform "$platform" -d "$work" "$req" >&2
    path="$work/$name"
    if [ ! -f "$path" ]; then
      echo "fetch_pjrt: pip downloaded no $name for $req (got: $(ls "$work"))" >&2
      exit 1
    fi
  fi
  local got
  got="$(sha256sum "$path" | cut -d' ' -f1)"
  if [ "$got" != "$sha" ]; then
    echo "fetch_pjrt: $path has sha256 $got, expected $sha: refusing it" >&2
    exit 1
  fi
  echo "$path"
}

# Extracts from wheel $1 the members starting with $2 into folder $3, with that prefix removed (a wheel is a
# zip; Python's zipfile avoids depending on unzip).
extract() {
  python3 - "$1" "$2" "$3" <<'EOF'
import os, sys, zipfile
wheel, prefix, dest = sys.argv[1:]
count = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = info.filename[len(prefix):]
        if rel.startswith("/") or ".." in rel.split("/"):
            sys.exit(f"fetch_pjrt: {wheel} holds an unsafe path {info.filename}")
        target = os.path.join(dest, rel) if rel else dest  # a prefix naming one file extracts it as dest
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as out:
            out.write(src.read())
        count += 1
if count == 0:
    sys.exit(f"fetch_pjrt: {wheel} has nothing under {prefix}")
EOF
}

# The stamp file records which wheel a folder was extracted from: a changed pin extracts again.
if [ "$(cat "$cache/include/.sha256" 2>/dev/null)" != "$header_sha" ]; then
  wheel="$(get_wheel "$header_wheel" "$header_req" "$header_sha")"
  rm -rf "$cache/include" "$work/include"
  extract "$wheel" "${header_prefix}xla/pjrt/c/" "$work/include/xla/pjrt/c"
  echo "$header_sha" >"$work/include/.sha256"
  mv "$work/include" "$cache/include"
  echo "fetch_pjrt: PJRT C API header in $cache/include/xla/pjrt/c" >&2
fi
rm -f "$work"/*.whl  # the 274 MB wheel goes before the next download

if [ "$(cat "$cache/lib/.sha256" 2>/dev/null)" != "$plugin_sha" ]; then
  wheel="$(get_wheel "$plugin_wheel" "$plugin_req" "$plugin_sha")"
  rm -rf "$cache/lib" "$work/lib"
  extract "$wheel" "$plugin_member" "$work/lib/$(basename "$plugin_member")"
  echo "$plugin_sha" >"$work/lib/.sha256"
  mv "$work/lib" "$cache/lib"
  echo "fetch_pjrt: CPU plugin in $cache/lib/$(basename "$plugin_member")" >&2
fi
if $cross; then
  # One file per wheel, each with its own stamp (<file>.sha256), extracted and renamed into place.
  mkdir -p "$cache/cross"
  for spec in "$tpu_wheel|$tpu_req|$tpu_sha|$tpu_member|manylinux_2_31_x86_64" \
              "$cuda_wheel|$cuda_req|$cuda_sha|$cuda_member|manylinux_2_27_x86_64"; do
    IFS='|' read -r name req sha member platform <<<"$spec"
    file="$cache/cross/$(basename "$member")"
    if [ "$(cat "$file.sha256" 2>/dev/null)" != "$sha" ] || [ ! -f "$file" ]; then
      wheel="$(get_wheel "$name" "$req" "$sha" "$platform")"
      extract "$wheel" "$member" "$work/$(basename "$member")"
      mv "$work/$(basename "$member")" "$file"
      echo "$sha" >"$file.sha256"
      rm -f "$work"/*.whl
      echo "fetch_pjrt: $(basename "$member") of $req in $cache/cross" >&2
    fi
  done
fi
echo "fetch_pjrt: $cache is up to date ($header_req's PJRT header, $plugin_req's CPU plugin$($cross && echo ", $tpu_req and $cuda_req for cross-compiling"))"
