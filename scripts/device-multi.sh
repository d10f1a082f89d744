#!/usr/bin/env bash
# Runs on a machine of 2+ GPUs (device tool, repo root) from a bundle of scripts/pack-device.sh:
# tensor parallelism over NCCL (greedy tokens TP 1 vs TP 2 on the 1B shape; 8B batch-1 decode TP 1
# vs TP 2) and data parallelism (serve --data-parallel-size 2, one GPU each, vs one replica, 1B
# at concurrency 256). Every step has a timeout, so a hang costs minutes, not the budget.
# usage: scripts/device-multi.sh BUNDLE_DIR
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/mg && tar -C /tmp/mg -xJf "$1/bundle.tar.xz"
pg=/tmp/mg/pg
export LD_LIBRARY_PATH=$pg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
source scripts/device-lib.sh
m1=$(model_dir llama-3.2-1b) m8=$(model_dir llama-3.1-8b)
logs=/tmp/mg/logs && mkdir -p $logs
nvidia-smi -L
echo "== greedy tokens, 1B shape (dummy weights), TP 1 vs TP 2"
for tp in 1 2; do
    timeout 240 "$pg/peregrine" generate --model "$m1" --load-format dummy --tensor-parallel-size $tp \
        --prompt "Once upon a time there was" --max-tokens 48 --temperature 0 --json > $logs/gen$tp.out 2> $logs/gen$tp.err
    echo "TP $tp: rc $? $(tail -1 $logs/gen$tp.out | head -c 300)"
    grep -iE "error|rank|NCCL" $logs/gen$tp.err | head -5
done
python3 - <<'PY'
import json
try:
    a = json.loads(open('/tmp/mg/logs/gen1.out').read().splitlines()[-1])["ids"]
    b = json.loads(open('/tmp/mg/logs/gen2.out').read().splitlines()[-1])["ids"]
    same = sum(x == y for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    print(f"greedy ids equal: {a == b} ({same}/{len(a)} positions, first difference at {first})")
except Exception as e:
    print("compare failed:", e)
PY
echo "== 8B shape batch-1 decode, TP 1 vs TP 2"
for tp in 1 2; do
    timeout 300 "$pg/peregrine" bench latency --model "$m8" --load-format dummy --tensor-parallel-size $tp \
        --batch-size 1 --input-len 128 --output-len 128 > $logs/lat$tp.log 2>&1
    echo "TP $tp: rc $? $(grep -E '^latency \(best' $logs/lat$tp.log)"
    grep -iE "error|NCCL WARN" $logs/lat$tp.log | head -3
done
echo "== 1B serve at concurrency 256: one replica vs --data-parallel-size 2 (a GPU each)"
for dp in 1 2; do
    "$pg/peregrine" serve --port 0 --model "$m1" --load-format dummy --data-parallel-size $dp > $logs/serve$dp.log 2>&1 & pid=$!
    url=$(wait_ready $logs/serve$dp.log)
    timeout 240 "$pg/peregrine" bench serve --url "$url" --quiet --num-requests 2048 --concurrency 256 \
        --input-len 128 --output-len 128 > $logs/bench$dp.txt 2>&1
    echo "DP $dp: $(grep -iE 'Output token throughput' $logs/bench$dp.txt) $(grep -iE 'Median TTFT' $logs/bench$dp.txt | tr -s ' ')"
    kill $pid; wait $pid 2>/dev/null
done
