#!/bin/sh
# A rank that dies or cannot load its shard must end every rank of `kiln generate --tp 2` within 60 s, with
# a non-zero exit, a message naming the rank and the cause, and no PNG.
#   rank_failure_test.sh KILN MODEL_DIR WORK_DIR killed-rank|unreadable-shard
set -u
kiln=$1 model=$2 work=$3 scenario=$4
rm -rf "$work" && mkdir -p "$work"
out="$work/out.png"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args="generate --tp 2 --prompt 'a red circle' --seed 1 --dtype f32 --max-sequence-length 16 --output $out"

case "$scenario" in
  unreadable-shard)
    # Rank 1 reads a copy of the model whose transformer file is cut short; rank 0 reads the good one.
    cp -r "$model" "$work/model" || exit 1
    weights="$work/model/transformer/diffusion_pytorch_model.safetensors"
    head -c 20000 "$model/transformer/diffusion_pytorch_model.safetensors" > "$weights"
    rank_cmd="if [ \"\$OMPI_COMM_WORLD_RANK\" = 1 ]; then m=$work/model; else m=$model; fi; exec $kiln $args --steps 4 --height 64 --width 64 --model \$m"
    expect="rank 1 of 2 failed: .*diffusion_pytorch_model.safetensors"
    ;;
  killed-rank)
    # Rank 1 is killed (SIGKILL) two seconds into a run of many steps.
    # The killer is a child of the rank's own process ($$ becomes kiln at exec), so mpirun sees its rank die.
    rank_cmd="if [ \"\$OMPI_COMM_WORLD_RANK\" = 1 ]; then (sleep 2; kill -9 \$\$) & fi; exec $kiln $args --steps 1000 --height 512 --width 512 --model $model"
    expect="process rank 1 .* exited on signal 9"
    ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac

start=$(date +%s)
timeout 60 mpirun -np 2 --oversubscribe sh -c "$rank_cmd" > "$work/log" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
cat "$work/log"
echo "exit status $status after ${elapsed}s"
[ "$status" -ne 0 ] || { echo "FAIL: the run exited 0"; exit 1; }
[ "$status" -ne 124 ] || { echo "FAIL: the ranks were still running after 60 s"; exit 1; }
grep -Eq "$expect" "$work/log" || { echo "FAIL: no message matching '$expect'"; exit 1; }
[ ! -e "$out" ] || { echo "FAIL: a PNG was written"; exit 1; }
echo "PASS: every rank ended in ${elapsed}s"
