#!/usr/bin/env bash
# Builds Kiln with warnings as errors and runs every test; then rebuilds the file loaders' and the tokenizers'
# tests (both parse untrusted files and text) under AddressSanitizer and UndefinedBehaviorSanitizer and runs them
# again.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh -DKILN_WERROR=ON
(cd build && ctest --output-on-failure -j "$(nproc)")

export CCACHE_BASEDIR="$PWD"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON -DKILN_WERROR=ON -DKILN_BUILD_BENCH=OFF >/dev/null
cmake --build build-sanitize -j "$(nproc)" --target kiln_test_io kiln_test_tokenizers
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -L "io|tokenizers")
