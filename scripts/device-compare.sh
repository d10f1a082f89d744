#!/usr/bin/env bash
# Runs on the GPU machine (through the device tool, from the repo root): two bundles packed by
# scripts/pack-device.sh, side by side, on the benchmarks a refactor must not slow down —
# batch-1 decode of the Llama 3.2 1B and 3.1 8B shapes and offline throughput of the 1B at 256
# requests (random bf16 weights, 128-token prompts and outputs) — alternating the bundles for
# ROUNDS rounds so that drift hits both alike. Prints one line per run and the best of each.
# usage: scripts/device-compare.sh OLD_BUNDLE_DIR NEW_BUNDLE_DIR [ROUNDS]   (default 2)
set -uo pipefail
old=$1 new=$2 rounds=${3:-2}
logs=/tmp/compare
mkdir -p "$logs" /tmp/pg
unpack() {  # bundle dir -> the unpacked pg folder
    local b=$1/bundle.tar.xz sum
    sum=$(md5sum "$b" | cut -c1-12)
    [[ -x /tmp/pg/$sum/pg/peregrine ]] || { mkdir -p "/tmp/pg/$sum" && tar -C "/tmp/pg/$sum" -xJf "$b"; }
    echo "/tmp/pg/$sum/pg"
}
source scripts/device-lib.sh  # model_dir
declare -A best
run() {  # label, bundle pg folder, then bench arguments; prints the figure
    local label=$1 pg=$2; shift 2
    LD_LIBRARY_PATH=$pg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} "$pg/peregrine" bench "$@" --load-format dummy \
        > "$logs/$label.log" 2>&1
    local v=""
    case $1 in
        latency) v=$(grep -E '^latency \(best' "$logs/$label.log" | grep -oE 'decode [0-9.]+ tok/s' | grep -oE '[0-9.]+') ;;
        throughput) v=$(grep -E '^throughput \(best' "$logs/$label.log" | grep -oE '[0-9.]+ output tok/s' | grep -oE '^[0-9.]+') ;;
    esac
    echo "$label: ${v:-FAILED ($(tail -1 "$logs/$label.log"))}"
    local key=${label%_r*}
    if [[ -n $v ]] && awk -v a="$v" -v b="${best[$key]:-0}" 'BEGIN{exit !(a>b)}'; then best[$key]=$v; fi
}
pg_old=$(unpack "$old") pg_new=$(unpack "$new")
m1=$(model_dir llama-3.2-1b) m8=$(model_dir llama-3.1-8b)
for r in $(seq "$rounds"); do
    for side in old new; do
        pg=pg_$side
        run "${side}_1b_decode_r$r" "${!pg}" latency --model "$m1" --batch-size 1 --input-len 128 --output-len 128
        run "${side}_8b_decode_r$r" "${!pg}" latency --model "$m8" --batch-size 1 --input-len 128 --output-len 128
        run "${side}_1b_offline256_r$r" "${!pg}" throughput --model "$m1" --num-prompts 256 --input-len 128 \
            --output-len 128 --iters 2
    done
done
echo "==== best of $rounds rounds ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
for k in 1b_decode 8b_decode 1b_offline256; do
    o=${best[old_$k]:-0} n=${best[new_$k]:-0}
    awk -v k="$k" -v o="$o" -v n="$n" 'BEGIN{printf "  %-14s old %9.1f  new %9.1f  new/old %.4f\n", k, o, n, (o>0? n/o : 0)}'
done
