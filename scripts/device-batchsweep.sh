#!/usr/bin/env bash
# Decode throughput over batch sizes under several environments, in one call (device tool, repo
# root, a bundle of scripts/pack-device.sh in .device): `bench latency --batch-size B --input-len
# 128 --output-len 128 --iters 2` (best of 2), one line a run, configurations alternating at each
# batch size. MODEL as device-lib.sh's bench_model takes it (a GGUF path, a bench/models shape,
# SHAPE:fp8, llama3.1-8b:q4_k_m).
# usage: scripts/device-batchsweep.sh MODEL "B1 B2 ..." ["name=ENV=V ENV2=V2;name2=..."]
#        (default configurations: "default=")
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle .device batch >/dev/null
model=$1 batches=$2
IFS=';' read -r -a configs <<< "${3:-default=}"
bench_model "$model"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for b in $batches; do
    for c in "${configs[@]}"; do
        name=${c%%=*} envs=${c#*=}
        line=$(env $envs "$pg/peregrine" bench latency "${bench_args[@]}" --batch-size "$b" --input-len 128 \
            --output-len 128 --iters 2 2>&1 | grep -E '^latency \(best' | tail -1)
        echo "$model b$b $name: $(grep -oE 'decode [0-9.]+ tok/s \([0-9.]+ tok/s per sequence\)' <<< "$line")"
    done
done
