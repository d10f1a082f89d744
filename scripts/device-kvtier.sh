#!/usr/bin/env bash
# The KV cache's host tier (issue #21) on a GPU (device tool, repo root), from a bundle of
# scripts/pack-device.sh:
#   1. correctness: llama3-tiny (real weights) in batch-invariant mode, 24 greedy completions
#      over 8 prompt prefixes, twice, served with a KV pool smaller than the prefixes (plus a
#      host tier, and without) and with a large pool: the texts must be equal; the second pass
#      must see cached tokens through the tier;
#   2. speed: the 1B shape (random bf16) under `bench serve --dataset multi-turn` with the GPU
#      pool limited (the live histories need several times what it holds), host tier on vs off.
# usage: scripts/device-kvtier.sh BUNDLE_DIR
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle "$1" kt
cat > /tmp/kt/client.py <<'PY'
import json, sys, urllib.request
url, out = sys.argv[1], sys.argv[2]
words = "the cat sat on a warm mat while the dog ran in the park and the birds sang songs".split()
prefixes = [" ".join(words[(k * 2) % 17:] + words) for k in range(8)]
res = []
for rnd in range(2):
    for i in range(24):
        body = {"prompt": prefixes[i % 8] + f" item {i}", "max_tokens": 16, "temperature": 0}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"})
        j = json.load(urllib.request.urlopen(req, timeout=60))
        res.append({"round": rnd, "i": i, "text": j["choices"][0]["text"],
                    "cached": j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)})
json.dump(res, open(out, "w"))
print(f"{out}: round-2 cached tokens {sum(r['cached'] for r in res if r['round'] == 1)}")
PY
# SKIP_CHECK=1: speed only; SKIP_SPEED=1: the check only. SHAPE (bench/models folder, default llama-3.2-1b), GPU_KV / HOST_KV
# (bytes), ROUNDS, LOAD (bench serve's workload flags), MODES (default "tier notier"): the speed
# run's settings.
m=tests/data/llama3-tiny
for mode in $([[ -n ${SKIP_CHECK:-} ]] || echo big tier notier disk); do
    case $mode in
        big) args=(--kv-cache-memory 268435456) ;;
        tier) args=(--kv-cache-memory 131072 --kv-offload-memory 67108864) ;;
        notier) args=(--kv-cache-memory 131072) ;;
        # 8 host slots: nearly every block goes on to the disk tier and comes back from it.
        disk) mkdir -p /tmp/kt/disk
              args=(--kv-cache-memory 131072 --kv-offload-memory 32768 --kv-offload-disk /tmp/kt/disk
                    --kv-offload-disk-size 67108864) ;;
    esac
    "$pg/peregrine" serve --port 0 --model $m --batch-invariant "${args[@]}" > $logs/serve-$mode.log 2>&1 & pid=$!
    url=$(wait_ready $logs/serve-$mode.log)
    grep -E "KV cache:|host tier" $logs/serve-$mode.log | sed "s/^/$mode: /"
    timeout 120 python3 /tmp/kt/client.py "$url" $logs/$mode.json
    curl -s "$url/metrics" | grep -E "^peregrine:(kv_(off|on)loaded_blocks|host_prefix_cache_hits|disk_prefix_cache_hits|kv_disk_(written|read)_blocks|disk_kv_(read|write)_failures)" | sed "s/^/$mode: /"
    kill $pid; wait $pid 2>/dev/null
done
[[ -n ${SKIP_CHECK:-} ]] || python3 - "$logs" <<'PY'
import json, sys
d = sys.argv[1]
big, tier, no, disk = (json.load(open(f"{d}/{m}.json")) for m in ("big", "tier", "notier", "disk"))
same = sum(a["text"] == b["text"] for a, b in zip(big, tier))
print(f"greedy texts, tiny pool + host tier vs large pool: {same}/{len(big)} equal; "
      f"tiny pool without the tier vs large: {sum(a['text'] == b['text'] for a, b in zip(big, no))}/{len(big)}; "
      f"tiny pool + 8-slot host tier + disk tier vs large: {sum(a['text'] == b['text'] for a, b in zip(big, disk))}/{len(big)}")
PY
[[ -n ${SKIP_SPEED:-} ]] && exit 0

# Speed: multi-turn, GPU pool limited (1B default: 640 MB, ~20k tokens), host tier (16 GB) vs none.
shape=${SHAPE:-llama-3.2-1b}
m1=$(model_dir "$shape")
# LOAD="..." replaces the workload (e.g. longer turns, where a recompute costs more than a copy-back).
read -r -a load <<< "${LOAD:---dataset multi-turn --num-users 96 --turns 6 --system-prompt-len 300 --turn-len 80 --output-len 64 --concurrency 32}"
for round in $(seq ${ROUNDS:-2}); do
    for mode in ${MODES:-tier notier}; do
        extra=(); [[ $mode == tier ]] && extra=(--kv-offload-memory ${HOST_KV:-17179869184})
        "$pg/peregrine" serve --port 0 --model $m1 --load-format dummy --kv-cache-memory ${GPU_KV:-671088640} "${extra[@]}" \
            > $logs/mt-$mode.log 2>&1 & pid=$!
        url=$(wait_ready $logs/mt-$mode.log)
        timeout 300 "$pg/peregrine" bench serve --url "$url" --quiet --seed $round "${load[@]}" \
            --json $logs/mt-$mode-$round.json > $logs/mt-$mode-$round.txt 2>&1
        python3 - $logs/mt-$mode-$round.json "$mode r$round" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: mean TTFT {j['mean_ttft_ms']:.1f} ms, p99 {j['p99_ttft_ms']:.1f} ms, later turns "
      f"{j.get('mean_ttft_ms_later_turns') or 0:.1f} ms, {j['output_throughput']:.0f} output tok/s, "
      f"prefix hit rate {j.get('prefix_cache_hit_rate') or 0:.3f}, failed {j['failed']}")
PY
        curl -s "$url/metrics" | grep -E "^peregrine:(kv_(off|on)loaded_(blocks|bytes)|num_preemptions)" | tr '\n' ' '; echo
        kill $pid; wait $pid 2>/dev/null
    done
done
# The link the copies cross: pinned-memory copy bandwidth measured by the device's PyTorch (1 GiB,
# best of 5), beside the PCIe link nvidia-smi reports.
python3 - <<'PY'
import time, torch
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
d = torch.empty(n, dtype=torch.uint8, device="cuda")
for name, fn in (("host to device", lambda: d.copy_(h, non_blocking=True)), ("device to host", lambda: h.copy_(d, non_blocking=True))):
    best = 1e9
    for _ in range(5):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize(); best = min(best, time.perf_counter() - t)
    print(f"pinned {name}: {n / best / 1e9:.1f} GB/s")
PY
nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max --format=csv,noheader | head -1
