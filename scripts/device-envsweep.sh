#!/usr/bin/env bash
# Batch-1 decode under each value of one environment knob, values alternating within each round
# (device tool, repo root, a bundle of scripts/pack-device.sh in .device): `bench latency
# --batch-size B --input-len 128 --output-len 128`, random weights, one line a run.
# usage: scripts/device-envsweep.sh VAR "V1 V2 ..." [SHAPE...]   (shapes: bench/models folders,
#        default llama-3.2-1b; a shape suffixed :fp8 runs --quantization fp8; a path ending in
#        .gguf runs that file, its own weights)
#   ROUNDS (default 2), BATCH (default 1)
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle .device sweep
var=$1 values=$2
shift 2
shapes=("${@:-llama-3.2-1b}")
for round in $(seq "${ROUNDS:-2}"); do
    for shape in "${shapes[@]}"; do
        extra=()
        if [[ $shape == *.gguf ]]; then
            m=$shape
        else
            m=$(model_dir "${shape%%:*}")
            extra=(--load-format dummy)
        fi
        [[ $shape == *:fp8 ]] && extra+=(--quantization fp8)
        for v in $values; do
            line=$(env "$var=$v" "$pg/peregrine" bench latency --model "$m" "${extra[@]}" \
                --batch-size "${BATCH:-1}" --input-len 128 --output-len 128 2>&1 | grep -E '^latency \(best' | tail -1)
            echo "r$round $shape $var=$v: $(grep -oE 'decode [0-9.]+ tok/s' <<< "$line")"
        done
    done
done
