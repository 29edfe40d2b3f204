#!/usr/bin/env bash
# KILN_WERROR's compiler launcher (the CXX_COMPILER_LAUNCHER of Kiln's own targets, kiln_warnings() in
# CMakeLists.txt): runs the compile it is given (through ccache when that comes first), passes the compiler's
# messages on, and fails a compile that warned, deleting its object. That is -Werror's effect with the compiler's
# command line unchanged, so ccache's keys stay those of a build without KILN_WERROR (the README's first command)
# and the test command reuses its objects. ccache replays a cached compile's messages, so a warning fails a cache
# hit too.
set -uo pipefail
object=""
previous=""
for arg in "$@"; do
  [ "$previous" = "-o" ] && object="$arg"
  previous="$arg"
done
messages="$(mktemp)"
trap 'rm -f "$messages"' EXIT
"$@" 2>"$messages"
status=$?
cat "$messages" >&2
if [ "$status" -eq 0 ] && grep -q "warning:" "$messages"; then
  echo "KILN_WERROR: the compiler warned on ${object:-this file}; warnings are errors" >&2
  if [ -n "$object" ]; then rm -f "$object"; fi
  exit 1
fi
exit "$status"
