#!/usr/bin/env bash
# Before / after decode speed in one call (device tool, repo root): the bundle of
# scripts/pack-device.sh in BUNDLE_DIR is "new", OLD_BIN (a peregrine binary of the earlier build
# already on the machine, e.g. unpacked by an earlier call on the same warm machine: two bundles
# do not fit the 64 MiB a call carries) is "old"; both run with the new bundle's libraries.
# Runs `bench latency --batch-size 1 --input-len 128 --output-len 128` (best of 3;
# `--load-format dummy` for a shape) for each CASE, old then new, ROUNDS rounds (default 2), one
# line per result.
#   CASE: SHAPE[:EXTRA ARGS, commas for spaces], e.g. llama-3.1-8b  llama-3.1-8b:--quantization,fp8;
#         SHAPE is a bench/models folder (random weights of its shape) or a model file's absolute
#         path (e.g. a GGUF of scripts/make_random_gguf.py), loaded as it is
# usage: scripts/device-ab.sh BUNDLE_DIR OLD_BIN CASE...
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle "$1" ab
old_bin=$2
[[ -x $old_bin ]] || { echo "no old binary at $old_bin" >&2; exit 1; }
shift 2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t_start=$(date +%s)
for round in $(seq "${ROUNDS:-2}"); do
    for c in "$@"; do
        shape=${c%%:*}
        extra=()
        [[ $c == *:* ]] && IFS=, read -r -a extra <<< "${c#*:}"
        dummy=(--load-format dummy)
        if [[ $shape == /* ]]; then m=$shape dummy=(); else m=$(model_dir "$shape"); fi
        for build in old new; do
            bin=$pg/peregrine
            [[ $build == old ]] && bin=$old_bin
            f="$logs/$build-$(basename "${c//[^A-Za-z0-9.\/-]/_}")-r$round.log"
            timeout 300 "$bin" bench latency --model "$m" --batch-size 1 --input-len 128 --output-len 128 \
                "${dummy[@]}" "${extra[@]}" > "$f" 2>&1
            echo "[$(($(date +%s) - t_start)) s] $build $c r$round: rc $? $(grep -E '^latency \(best' "$f" | tail -1)"
        done
    done
done
