#!/usr/bin/env bash
# The README's test command (after ./scripts/setup.sh --tests):
#  1. builds everything (the command, every test and benchmark) with warnings as errors and runs every test,
#     the installed CMake package's out-of-tree example included;
#  2. installs the Python package (`pip install .`: its build in build-python/ finds the library's objects in
#     ccache), runs its tests (tests/python) against it, and builds a wheel;
#  3. builds the library once more with clang under AddressSanitizer and UndefinedBehaviorSanitizer (and
#     libFuzzer's coverage), and with it: the file loaders', the tokenizers' and kiln serve's tests (untrusted
#     files, text and requests; the server's threads), run with leak detection; then the libFuzzer targets,
#     which replay their corpus and crash inputs and fuzz each target briefly (KILN_FUZZ_SECONDS, default 15;
#     docs/reliability.md). One sanitized build serves both, so the command builds the library three times in
#     all (Release, the Python package's from ccache, the sanitized one).
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths relative to the checkout in ccache's keys, so that another clone (CI's) reuses the cached objects, and
# the Python package's build reuses the main build's.
export CCACHE_BASEDIR="$PWD"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=ON >/dev/null
cmake --build build -j "$(nproc)"
(cd build && ctest --output-on-failure -j "$(nproc)")

# The same compiler and flags as build/, so that ccache serves the library's objects.
CXX=c++ python3 -m pip install -q --disable-pip-version-check . -C cmake.define.KILN_WERROR=ON
python3 -m pytest -q tests/python
CXX=c++ python3 -m pip wheel -q --disable-pip-version-check --no-deps . -w build/wheels -C cmake.define.KILN_WERROR=ON
ls build/wheels/kiln-*.whl

CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON -DKILN_BUILD_TESTS=ON \
    -DKILN_BUILD_BENCH=OFF -DKILN_FUZZ_SECONDS="${KILN_FUZZ_SECONDS:-15}" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target kiln_test_io kiln_test_tokenizers kiln_test_serve kiln_fuzz
(cd build-fuzz && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -j "$(nproc)" -L "io|tokenizers|serve" -LE fuzz)
(cd build-fuzz && ctest --output-on-failure -j "$(nproc)" -L fuzz)
