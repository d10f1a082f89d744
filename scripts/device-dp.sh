#!/usr/bin/env bash
# Runs on the GPU machine (device tool, repo root), from a bundle packed by scripts/pack-device.sh:
# the 1B shape (random bf16 weights) served by one replica, then by `serve --data-parallel-size 2`
# sharing the GPU, each under `bench serve` at concurrency 256; then the router's own latency:
# short requests at concurrency 1 straight to a replica and through `peregrine router` in front
# of it, alternating. Prints one line per run.
# usage: scripts/device-dp.sh BUNDLE_DIR [NUM_REQUESTS]   (default 2048)
set -uo pipefail
bundle=$1 n=${2:-2048}
mkdir -p /tmp/dp && tar -C /tmp/dp -xJf "$bundle/bundle.tar.xz"
pg=/tmp/dp/pg
export LD_LIBRARY_PATH=$pg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
m=/tmp/models/llama-3.2-1b
if [[ ! -f $m/config.json ]]; then
    mkdir -p "$m" /tmp/tok
    cp bench/models/llama-3.2-1b/config.json "$m/"
    tar -C /tmp/tok -xJf tests/data/tokenizers.tar.xz tokenizers/llama3
    cp /tmp/tok/tokenizers/llama3/tokenizer*.json "$m/"
fi
logs=/tmp/dp/logs && mkdir -p $logs
wait_ready() {  # log file -> the URL once ready
    for _ in $(seq 600); do
        u=$(grep -v "^replica " "$1" | grep -oE "ready: (serving '[^']*' at|routing at) http://[0-9.:]+" | grep -oE 'http://[0-9.:]+' | tail -1)
        [[ -n $u ]] && { echo "$u"; return; }
        sleep 0.5
    done
}
bench() {  # label url args...
    local label=$1 url=$2; shift 2
    "$pg/peregrine" bench serve --url "$url" --quiet --json "$logs/$label.json" "$@" > "$logs/$label.txt" 2>&1
    python3 - "$label" "$logs/$label.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[2]))
print(f"{sys.argv[1]}: {j.get('output_throughput', 0):.1f} output tok/s, TTFT median {j.get('median_ttft_ms', 0):.2f} ms "
      f"p99 {j.get('p99_ttft_ms', 0):.2f} ms, e2e median {j.get('median_e2el_ms', 0):.2f} ms, failed {j.get('failed', 0)}")
PY
}
serve() {  # log, args...
    local log=$1; shift
    "$pg/peregrine" serve --port 0 --model "$m" --load-format dummy "$@" > "$log" 2>&1 &
    echo $!
}
load=(--num-requests "$n" --concurrency 256 --input-len 128 --output-len 128)
for round in 1 2; do
    pid=$(serve $logs/one.log); url=$(wait_ready $logs/one.log)
    bench "one_replica_r$round" "$url" "${load[@]}"
    kill $pid; wait $pid 2>/dev/null
    pid=$(serve $logs/dp2.log --data-parallel-size 2); url=$(wait_ready $logs/dp2.log)
    bench "dp2_shared_gpu_r$round" "$url" "${load[@]}"
    kill $pid; wait $pid 2>/dev/null
done
# The router's own latency: one replica, concurrency 1, 1-token answers.
pid=$(serve $logs/direct.log); url=$(wait_ready $logs/direct.log)
"$pg/peregrine" router --port 0 --backend "$url" > $logs/router.log 2>&1 & rpid=$!
rurl=$(wait_ready $logs/router.log)
small=(--num-requests 400 --concurrency 1 --input-len 32 --output-len 1)
for round in 1 2 3; do
    bench "direct_r$round" "$url" "${small[@]}"
    bench "via_router_r$round" "$rurl" "${small[@]}"
done
kill $rpid $pid; wait 2>/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
