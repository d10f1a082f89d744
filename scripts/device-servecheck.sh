#!/usr/bin/env bash
# serve under load with the step limits by device (1024 sequences / 8192 tokens on a GPU of
# >= 70 GiB) against the old 256 / 2048 (device tool, repo root, a bundle of
# scripts/pack-device.sh in .device): the 1B shape (random bf16), `bench serve --num-requests
# 2048 --concurrency 256`, 128-token prompts and outputs, fresh prompt seeds, two rounds.
# usage: scripts/device-servecheck.sh
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle .device sv
m1=$(model_dir llama-3.2-1b)
for round in 1 2; do
    for mode in auto old; do
        extra=()
        [[ $mode == old ]] && extra=(--max-num-seqs 256 --max-num-batched-tokens 2048)
        "$pg/peregrine" serve --port 0 --model "$m1" --load-format dummy "${extra[@]}" > "$logs/serve-$mode.log" 2>&1 &
        pid=$!
        url=$(wait_ready "$logs/serve-$mode.log")
        timeout 200 "$pg/peregrine" bench serve --url "$url" --quiet --num-requests 2048 --concurrency 256 \
            --input-len 128 --output-len 128 --seed $((round * 10 + ${#mode})) --json "$logs/$mode-$round.json" \
            > /dev/null 2>&1
        python3 - "$logs/$mode-$round.json" "$mode r$round" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: {j['output_throughput']:.0f} output tok/s, TTFT mean {j['mean_ttft_ms']:.1f} "
      f"p99 {j['p99_ttft_ms']:.1f} ms, TPOT mean {j['mean_tpot_ms']:.2f} p99 {j['p99_tpot_ms']:.2f} ms, "
      f"failed {j['failed']}")
PY
        kill $pid
        wait $pid 2>/dev/null
    done
done
