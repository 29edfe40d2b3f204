#!/bin/sh
# The fuzzing campaign behind docs/reliability.md: runs the libFuzzer targets of build-fuzz/ one at a time,
# in turn, each for SLICE seconds per round, ROUNDS times (at the lowest priority unless NICE=0; two
# instances on disjoint target lists use two cores). Each target fuzzes its own
# working corpus ($WORK/corpus/<target>, seeded from fuzz/corpus/<target>), keeps going after a finding
# (fork mode: crashes, timeouts and out-of-memory inputs are saved under $WORK/findings/<target>/) and logs to
# $WORK/logs/<target>.<start time>.log; tools/fuzz/campaign_table.py turns the logs into the rows committed in
# fuzz/campaign/ (the logs stay on the machine) and sums those rows into the table.
#   usage: fuzz/campaign.sh [SLICE_SECONDS] [ROUNDS] [TARGET...]   (WORK defaults to /work/fuzz-campaign)
# Afterwards, merge the working corpora back into the repository's with fuzz/minimise.sh.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
slice=${1:-900}
rounds=${2:-4}
[ $# -ge 2 ] && shift 2 || shift $#
targets=${*:-"safetensors checkpoint_index config_json gguf clip_bpe sentencepiece tokenizer_json tokenizer_text regex png cli_flags lora_keys lora_file serve_request"}
work=${WORK:-/work/fuzz-campaign}
mkdir -p "$work/logs"
round=1
while [ "$round" -le "$rounds" ]; do
  for t in $targets; do
    bin="$root/build-fuzz/fuzz/fuzz_$t"
    [ -x "$bin" ] || { echo "campaign: $bin is not built" >&2; continue; }
    mkdir -p "$work/corpus/$t" "$work/findings/$t"
    [ -n "$(ls -A "$work/corpus/$t")" ] || cp "$root/fuzz/corpus/$t/"* "$work/corpus/$t/"
    dict=""
    [ -f "$root/fuzz/dict/$t.dict" ] && dict="-dict=$root/fuzz/dict/$t.dict"
    log="$work/logs/$t.$(date +%Y%m%d-%H%M%S).log"
    echo "campaign: round $round, $t for ${slice}s -> $log"
    (cd "$work/findings/$t" && nice -n "${NICE:-19}" "$bin" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -max_total_time="$slice" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 $dict \
        -artifact_prefix="$work/findings/$t/" "$work/corpus/$t" > "$log" 2>&1)
    # Jobs killed on a finding leave their scratch folder (fuzz_support.h: kiln-fuzz-<pid>-*) behind; only
    # those of dead processes go, so that two campaigns can run side by side.
    for d in /dev/shm/kiln-fuzz-*; do
      [ -e "$d" ] || continue
      pid=${d#/dev/shm/kiln-fuzz-}
      pid=${pid%%-*}
      kill -0 "$pid" 2>/dev/null || rm -rf "$d"
    done
  done
  round=$((round + 1))
done
echo "campaign: done"
