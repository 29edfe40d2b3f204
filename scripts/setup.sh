#!/usr/bin/env bash
# Installs what Kiln needs on Debian 12. Idempotent: installs only what is missing.
#   ./scripts/setup.sh           what building and running `kiln` needs (the README's first command)
#   ./scripts/setup.sh --tests   that, plus what the test command needs: GoogleTest and Google Benchmark, clang
#                                for the fuzz targets, the Python packages of the package's tests, --pjrt's, and
#                                the TPU and CUDA compilers the cross-compiling tests use (fetch_pjrt.sh --cross)
#   ./scripts/setup.sh --pjrt    the PJRT C API header and the CPU test plugin (scripts/fetch_pjrt.sh, into Kiln's
#                                cache); rebuild afterwards so that CMake finds the header
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(build-essential cmake ccache pkg-config libdnnl-dev nlohmann-json3-dev libpng-dev libcli11-dev
          libopenmpi-dev openmpi-bin
          libcpp-httplib-dev)  # kiln serve's HTTP
tests=false
pjrt=false
for arg in "$@"; do
  case "$arg" in
    --tests) tests=true; pjrt=true ;;
    --pjrt) pjrt=true ;;
    *) echo "setup: unknown option $arg (expected --tests or --pjrt)" >&2; exit 2 ;;
  esac
done
if $tests; then
  packages+=(libgtest-dev libgmock-dev libbenchmark-dev
             clang-14 libclang-rt-14-dev libomp-14-dev  # clang: the fuzz targets (libFuzzer, fuzz/)
             chromium chromium-driver)                   # kiln serve's web page, tested in a browser
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if $tests; then
  # The Python packages of the package's tests and of kiln serve's (pytest, the official openai client,
  # Selenium), pinned; pip installs only what is missing or at another version.
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
      -r tests/python/requirements.txt -r tests/serve/requirements.txt
fi
if $tests; then
  ./scripts/fetch_pjrt.sh --cross
elif $pjrt; then
  ./scripts/fetch_pjrt.sh
fi
