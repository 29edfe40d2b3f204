#!/usr/bin/env bash
# Configures and builds Kiln into build/ (Release). Extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths relative to the checkout in ccache's keys, so that another clone (CI's) reuses the cached objects.
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
