# Sourced by scripts/device_check.sh and scripts/device_bundle.sh: find_pjrt_header prints the folder holding
# xla/pjrt/c/pjrt_c_api.h ($KILN_PJRT_INCLUDE_DIR, else build-device/pjrt/include in the checkout $1, else
# Kiln's cache) and fails when none has it.
find_pjrt_header() {
  local root="$1" dir
  for dir in "${KILN_PJRT_INCLUDE_DIR:-}" "$root/build-device/pjrt/include" \
    "${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}/pjrt/include"; do
    if [ -n "$dir" ] && [ -f "$dir/xla/pjrt/c/pjrt_c_api.h" ]; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}
