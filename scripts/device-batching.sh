#!/usr/bin/env bash
# Offline throughput on a GPU (device tool, repo root), from a bundle of scripts/pack-device.sh:
#   1. issue #25 defect 8: the step defaults by device (auto: 1024 sequences / 8192 tokens on a
#      GPU of >= 70 GiB) against the old 256 / 2048, 8B shape, 1024 prompts;
#   2. issue #25 defect 6: continuous vs static batching, lengths drawn with --range-ratio;
#   3. issue #22: every request constrained by a JSON schema vs none, 1B shape (the schema's
#      array needs more than --output-len tokens, so both generate the same number).
# Random bf16 weights (--load-format dummy); 128-token prompts and outputs unless said.
# usage: scripts/device-batching.sh BUNDLE_DIR   (STEPS: which of defaults batching schema)
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle "$1" bb
m1=$(model_dir llama-3.2-1b)
m8=$(model_dir llama-3.1-8b)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tp() {
    local name=$1
    shift
    timeout 240 "$pg/peregrine" bench throughput --load-format dummy --warmup 1 --iters ${ITERS:-2} --json "$logs/$name.json" "$@" \
        > "$logs/$name.txt" 2>&1 || echo "$name: exit $?"
    grep -E "scheduler:|throughput \(best" "$logs/$name.txt" | sed "s/^/$name: /"
}
steps=${STEPS:-defaults batching schema}
if [[ $steps == *defaults* ]]; then
    tp 8b-auto-1024 --model "$m8" -n 1024
    tp 8b-old-1024 --model "$m8" -n 1024 --max-num-seqs 256 --max-num-batched-tokens 2048
    tp 1b-auto-1024 --model "$m1" -n 1024
    tp 1b-old-1024 --model "$m1" -n 1024 --max-num-seqs 256 --max-num-batched-tokens 2048
fi
if [[ $steps == *batching* ]]; then
    for r in 0.5 0.9; do
        for mode in static continuous; do
            tp 1b-$mode-r$r --model "$m1" -n 1024 --max-num-seqs 256 --range-ratio $r --seed 1 --batching $mode
        done
    done
    for mode in static continuous; do
        tp 8b-$mode-r0.9 --model "$m8" -n 512 --max-num-seqs 256 --range-ratio 0.9 --seed 1 --batching $mode
    done
fi
if [[ $steps == *schema* ]]; then
    cat > /tmp/bb/schema.json <<'JSON'
{"type": "object", "properties": {"readings": {"type": "array", "items": {"type": "integer"}, "minItems": 200}},
 "required": ["readings"], "additionalProperties": false}
JSON
    for round in 1 2; do
        tp 1b-free-$round --model "$m1" -n 256
        tp 1b-schema-$round --model "$m1" -n 256 --json-schema /tmp/bb/schema.json
    done
fi
python3 - "$logs" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/*.json")):
    j = json.load(open(f))
    print(f"{os.path.basename(f)[:-5]:22s} {j['output_tokens_per_second']:9.1f} output tok/s  "
          f"{j['output_tokens']:7d} output tokens  {j['steps']:6d} steps  seqs {j['max_num_seqs']} "
          f"tokens {j['max_num_batched_tokens']}")
PY
