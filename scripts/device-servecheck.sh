#!/usr/bin/env bash
# serve under load, step-limit settings side by side (device tool, repo root, a bundle of
# scripts/pack-device.sh in .device): the 1B shape (random bf16), `bench serve --num-requests
# 2048 --concurrency C`, 128-token prompts and outputs, fresh prompt seeds, settings alternating
# within each round.
# usage: scripts/device-servecheck.sh
#   CONFIGS="name=serve flags;..."  (NAME=VALUE words set the server's environment) default: "auto=;old=--max-num-seqs 256 --max-num-batched-tokens 2048"
#                                    (auto: 1024 sequences / 8192 tokens on a GPU of >= 70 GiB)
#   CONCURRENCY="256 64"            the concurrencies (default 256), ROUNDS (default 2),
#   SHAPE                           bench/models folder (default llama-3.2-1b)
#   WARMUP                          requests sent (at the run's concurrency, another seed) to each fresh
#                                   server before the measured run (default 0: the run meets a cold server)
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle .device sv
m1=$(model_dir "${SHAPE:-llama-3.2-1b}")
IFS=';' read -r -a configs <<< "${CONFIGS:-auto=;old=--max-num-seqs 256 --max-num-batched-tokens 2048}"
for round in $(seq "${ROUNDS:-2}"); do
    for conc in ${CONCURRENCY:-256}; do
        for cfg in "${configs[@]}"; do
            mode=${cfg%%=*}
            read -r -a words <<< "${cfg#*=}"
            envs=() extra=()  # words NAME=VALUE (upper-case NAME) are environment settings
            for w in "${words[@]}"; do [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]] && envs+=("$w") || extra+=("$w"); done
            env "${envs[@]}" "$pg/peregrine" serve --port 0 --model "$m1" --load-format dummy "${extra[@]}" > "$logs/serve-$mode.log" 2>&1 &
            pid=$!
            url=$(wait_ready "$logs/serve-$mode.log")
            if [[ ${WARMUP:-0} -gt 0 ]]; then
                timeout 200 "$pg/peregrine" bench serve --url "$url" --quiet --num-requests "$WARMUP" --concurrency "$conc" \
                    --input-len 128 --output-len 128 --seed $((round * 1000 + conc * 3 + ${#mode} + 500)) > /dev/null 2>&1
            fi
            timeout 200 "$pg/peregrine" bench serve --url "$url" --quiet --num-requests 2048 --concurrency "$conc" \
                --input-len 128 --output-len 128 --seed $((round * 1000 + conc * 3 + ${#mode})) \
                --json "$logs/$mode-$conc-$round.json" > /dev/null 2>&1
            python3 - "$logs/$mode-$conc-$round.json" "$mode c$conc r$round" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: {j['output_throughput']:.0f} output tok/s, TTFT mean {j['mean_ttft_ms']:.1f} "
      f"p50 {j['median_ttft_ms']:.1f} p99 {j['p99_ttft_ms']:.1f} ms, TPOT mean {j['mean_tpot_ms']:.2f} "
      f"p50 {j['median_tpot_ms']:.2f} p99 {j['p99_tpot_ms']:.2f} ms, failed {j['failed']}")
PY
            # Where TTFT goes on the server side (histogram means since start): queue (arrival to
            # first schedule), prefill (first schedule to first token), TTFT (arrival to first token).
            python3 - "$url" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1] + "/metrics", timeout=10).read().decode()
vals = {}
for line in text.splitlines():
    if line.startswith("peregrine:") and ("_sum" in line.split("{")[0] or "_count" in line.split("{")[0]):
        name = line.split("{")[0].split(" ")[0]
        vals[name] = vals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
out = []
for h in ("request_queue_time_seconds", "request_prefill_time_seconds", "time_to_first_token_seconds"):
    n = vals.get(f"peregrine:{h}_count", 0)
    if n: out.append(f"{h.replace('_seconds', '')} mean {1e3 * vals[f'peregrine:{h}_sum'] / n:.1f} ms")
print("  server:", ", ".join(out))
PY
            kill $pid
            wait $pid 2>/dev/null
        done
    done
done
