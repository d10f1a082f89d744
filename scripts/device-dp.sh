#!/usr/bin/env bash
# Runs on the GPU machine (device tool, repo root), from a bundle packed by scripts/pack-device.sh:
# the 1B shape (random bf16 weights) under `bench serve` at concurrency 256, served by
#   - one replica, straight (the baseline), and through `peregrine router` (this build's, and an
#     older router binary given as OLD_ROUTER, for a before/after of the router alone);
#   - `serve --data-parallel-size 2` sharing the GPU (two processes time-slicing it), and the same
#     under CUDA MPS when nvidia-cuda-mps-control exists (its daemon is started for the run in a
#     private pipe directory and quit after; no GPU setting is changed);
# then the router's own latency: short requests at concurrency 1, straight and through the router.
# Prints one line per run; logs under $OUT/dp when OUT is set.
# usage: scripts/device-dp.sh BUNDLE_DIR [NUM_REQUESTS]   (default 2048; OLD_ROUTER=path optional;
#        MODEL=DIR SERVE_ARGS="--device cpu" for a dry run without a GPU)
set -uo pipefail
bundle=$1 n=${2:-2048}
mkdir -p /tmp/dp && tar -C /tmp/dp -xJf "$bundle/bundle.tar.xz"
pg=/tmp/dp/pg
export LD_LIBRARY_PATH=$pg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
source scripts/device-lib.sh
m=${MODEL:-$(model_dir llama-3.2-1b)}  # MODEL, SERVE_ARGS: a dry run elsewhere (e.g. the CPU)
logs=${OUT:-/tmp/dp}/dp && mkdir -p "$logs"
cpu_of() { awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }  # clock ticks, user+sys
seed=0
bench() {  # label url [pid whose CPU to report] -- args...
    local label=$1 url=$2 pid=${3:-}; shift 3
    local c0=0; [[ -n $pid ]] && c0=$(cpu_of "$pid")
    # A new seed every run: prompts another run sent would be prefix-cache hits.
    seed=$((seed + 1))
    timeout 300 "$pg/peregrine" bench serve --url "$url" --quiet --seed $seed --json "$logs/$label.json" "$@" \
        > "$logs/$label.txt" 2>&1
    local c1=0; [[ -n $pid ]] && c1=$(cpu_of "$pid")
    python3 - "$label" "$logs/$label.json" "$((c1 - c0))" <<'PY'
import json, sys
j = json.load(open(sys.argv[2]))
cpu = int(sys.argv[3]) / 100
events = j.get('completed', 0) * (j.get('total_output_tokens', 0) / max(1, j.get('completed', 1)) + 2)
extra = f", router CPU {cpu:.1f} s ({cpu / j['duration'] * 100:.0f}%, {cpu * 1e6 / max(1, events):.1f} us/event)" if cpu > 0 else ""
print(f"{sys.argv[1]}: {j.get('output_throughput', 0):.1f} output tok/s, TTFT median {j.get('median_ttft_ms', 0):.2f} ms "
      f"p99 {j.get('p99_ttft_ms', 0):.2f} ms, e2e median {j.get('median_e2el_ms', 0):.2f} ms, failed {j.get('failed', 0)}{extra}")
PY
}
serve() {  # log, args... -> pid
    local log=$1; shift
    "$pg/peregrine" serve --port 0 --model "$m" --load-format dummy ${SERVE_ARGS:-} "$@" > "$log" 2>&1 &
    echo $!
}
load=(--num-requests "$n" --concurrency 256 --input-len 128 --output-len 128)
warm=(--num-requests 512 --concurrency 256 --input-len 128 --output-len 128)

# One replica: straight, through this router, through the old one (alternating, 2 rounds).
pid=$(serve "$logs/one.log"); url=$(wait_ready "$logs/one.log")
"$pg/peregrine" router --port 0 --backend "$url" > "$logs/router.log" 2>&1 & rpid=$!
rurl=$(wait_ready "$logs/router.log")
if [[ -n ${OLD_ROUTER:-} ]]; then
    "$OLD_ROUTER" router --port 0 --backend "$url" > "$logs/router_old.log" 2>&1 & opid=$!
    ourl=$(wait_ready "$logs/router_old.log")
fi
bench warmup "$url" "" "${warm[@]}" > /dev/null
for round in 1 2; do
    bench "one_replica_r$round" "$url" "" "${load[@]}"
    bench "via_router_r$round" "$rurl" "$rpid" "${load[@]}"
    [[ -n ${OLD_ROUTER:-} ]] && bench "via_old_router_r$round" "$ourl" "$opid" "${load[@]}"
done
# The router's own latency: concurrency 1, 1-token answers.
small=(--num-requests 400 --concurrency 1 --input-len 32 --output-len 1)
for round in 1 2 3; do
    bench "direct_c1_r$round" "$url" "" "${small[@]}"
    bench "via_router_c1_r$round" "$rurl" "" "${small[@]}"
done
kill $rpid ${opid:-} $pid; wait 2>/dev/null

one_vs_dp2() {  # label suffix: one replica, then --data-parallel-size 2, each warmed, 2 runs each
    local pid url
    pid=$(serve "$logs/one$1.log"); url=$(wait_ready "$logs/one$1.log")
    bench "one$1_warmup" "$url" "" "${warm[@]}" > /dev/null
    for round in 1 2; do bench "one_replica${1}_r$round" "$url" "" "${load[@]}"; done
    kill $pid; wait $pid 2>/dev/null
    pid=$(serve "$logs/dp2$1.log" --data-parallel-size 2); url=$(wait_ready "$logs/dp2$1.log")
    bench "dp2$1_warmup" "$url" "" "${warm[@]}" > /dev/null
    for round in 1 2; do bench "dp2_shared_gpu${1}_r$round" "$url" "" "${load[@]}"; done
    kill $pid; wait $pid 2>/dev/null
}
one_vs_dp2 ""
if command -v nvidia-cuda-mps-control > /dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    if nvidia-cuda-mps-control -d; then
        one_vs_dp2 _mps
        echo quit | nvidia-cuda-mps-control
    else
        echo "MPS: the control daemon did not start"
    fi
else
    echo "MPS: nvidia-cuda-mps-control not found"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
nproc
