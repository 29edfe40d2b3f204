#!/bin/sh
# Merges a campaign's working corpora back into the repository's: for each target, the inputs of
# $WORK/corpus/<target> up to MAX_BYTES that reach instrumented edges fuzz/corpus/<target> does not
# reach are added to it (edges only, -use_counters=0: hit counts would keep thousands of near-copies). Keeps the
# committed corpora to about 1 MB a target, so that CI's sanitizer replay stays quick. MAX_BYTES defaults to 4096,
# more for targets whose smallest meaningful inputs are larger: GGUF files (which carry tensor data) 65536,
# tokenizer.json and spiece.model files 16384.
#   usage: fuzz/minimise.sh [TARGET...]   (WORK defaults to /work/fuzz-campaign; no TARGET: all of $WORK/corpus)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/work/fuzz-campaign}
targets=${*:-$(ls "$work/corpus")}  # by default every target the campaign fuzzed
for t in $targets; do
  case $t in
    gguf) max=${MAX_BYTES:-65536} ;;
    tokenizer_json | sentencepiece) max=${MAX_BYTES:-16384} ;;
    *) max=${MAX_BYTES:-4096} ;;
  esac
  small=$(mktemp -d)
  find "$work/corpus/$t" -type f -size -"$((max + 1))"c -exec cp {} "$small/" \;
  before=$(ls "$root/fuzz/corpus/$t" | wc -l)
  (cd "$small" && "$root/build-fuzz/fuzz/fuzz_$t" -merge=1 -use_counters=0 -timeout=10 -rss_limit_mb=2048 \
      "$root/fuzz/corpus/$t" "$small" > "$small.log" 2>&1) || { echo "minimise: $t failed, see $small.log" >&2; exit 1; }
  echo "minimise: $t: $before -> $(ls "$root/fuzz/corpus/$t" | wc -l) inputs ($(du -sh "$root/fuzz/corpus/$t" | cut -f1))"
  rm -rf "$small" "$small.log"
done
