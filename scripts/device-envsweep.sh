#!/usr/bin/env bash
# Decode under each value of one environment knob (or of several set together), values
# alternating within each round (device tool, repo root, a bundle of scripts/pack-device.sh in
# .device): `bench latency --batch-size B --input-len 128 --output-len 128`, random weights, one
# line a run.
# usage: scripts/device-envsweep.sh VAR[,VAR...] "V1 V2 ..." [SHAPE...]   (each value is set in
#        every VAR named, e.g. PEREGRINE_GEMV_NORM_MAX_ROWS,PEREGRINE_GEMV_ADD_MAX_ROWS; shapes as
#        device-lib.sh's bench_model takes them, default llama-3.2-1b: bench/models folders,
#        SHAPE:fp8, a .gguf path, llama3.1-8b:q4_k_m)
#   ROUNDS (default 2), BATCH (default 1)
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle .device sweep
var=$1 values=$2
shift 2
IFS=, read -ra vars <<< "$var"
shapes=("${@:-llama-3.2-1b}")
for round in $(seq "${ROUNDS:-2}"); do
    for shape in "${shapes[@]}"; do
        bench_model "$shape"
        for v in $values; do
            assigns=()
            for name in "${vars[@]}"; do assigns+=("$name=$v"); done
            line=$(env "${assigns[@]}" "$pg/peregrine" bench latency "${bench_args[@]}" \
                --batch-size "${BATCH:-1}" --input-len 128 --output-len 128 2>&1 | grep -E '^latency \(best' | tail -1)
            echo "r$round $shape $var=$v: $(grep -oE 'decode [0-9.]+ tok/s' <<< "$line")"
        done
    done
done
