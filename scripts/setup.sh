#!/usr/bin/env bash
# Installs what Kiln needs to build and test on Debian 12. Idempotent: installs only what is missing.
set -euo pipefail
packages=(build-essential cmake ccache pkg-config libdnnl-dev nlohmann-json3-dev libpng-dev libcli11-dev
          libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev openmpi-bin
          clang-14 libclang-rt-14-dev libomp-14-dev  # clang: the fuzz targets (libFuzzer, fuzz/)
          libcpp-httplib-dev                         # kiln serve's HTTP
          chromium chromium-driver)                  # kiln serve's web page, tested in a browser
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

# The Python packages of kiln serve's tests (pytest, the official openai client, Selenium), pinned; pip
# installs only what is missing or at another version.
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    -r "$(dirname "$0")/../tests/serve/requirements.txt"
