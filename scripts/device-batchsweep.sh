#!/usr/bin/env bash
# Decode throughput over batch sizes under several environments, in one call (device tool, repo
# root, a bundle of scripts/pack-device.sh in .device): `bench latency --batch-size B --input-len
# 128 --output-len 128 --iters 2` (best of 2), one line a run, configurations alternating at each
# batch size. A model is a GGUF path; llama3.1-8b / llama3.2-1b with a type (q4_k_m, q8_0): the
# random GGUF of scripts/make_random_gguf.py (Llama 3 vocabulary), written to /tmp/g first, once
# per machine; or a bench/models folder name (llama-3.1-8b): random bf16 weights (dummy).
# usage: scripts/device-batchsweep.sh MODEL[:TYPE] "B1 B2 ..." ["name=ENV=V ENV2=V2;name2=..."]
#        (default configurations: "default=")
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle .device batch >/dev/null
model=$1 batches=$2
IFS=';' read -r -a configs <<< "${3:-default=}"
extra=()
if [[ $model != *.gguf && $model != *:* ]]; then
    model=$(model_dir "$model")
    extra=(--load-format dummy)
elif [[ $model != *.gguf ]]; then
    shape=${model%%:*} type=${model##*:}
    f=/tmp/g/$shape-$type.gguf
    if [[ ! -f $f ]]; then
        mkdir -p /tmp/g /tmp/tok
        tar -C /tmp/tok -xJf tests/data/tokenizers.tar.xz tokenizers/llama3
        python3 scripts/make_random_gguf.py /tmp/tok/tokenizers/llama3/tokenizer.json "$f" --shape "$shape" \
            --dtype "$type" --reuse-random | tail -1
    fi
    model=$f
fi
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for b in $batches; do
    for c in "${configs[@]}"; do
        name=${c%%=*} envs=${c#*=}
        line=$(env $envs "$pg/peregrine" bench latency --model "$model" "${extra[@]}" --batch-size "$b" --input-len 128 \
            --output-len 128 --iters 2 2>&1 | grep -E '^latency \(best' | tail -1)
        echo "$(basename "$model") b$b $name: $(grep -oE 'decode [0-9.]+ tok/s \([0-9.]+ tok/s per sequence\)' <<< "$line")"
    done
done
