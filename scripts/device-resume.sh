#!/usr/bin/env bash
# Issue #21's "seed experiment" on a GPU (device tool, repo root), from a bundle of
# scripts/pack-device.sh: a conversation resumed after its KV blocks were pushed out of the GPU
# pool. For each history length L: send the history once (its blocks are cached), push them out
# with filler prompts larger than the GPU pool, then send the history again plus a short new
# turn with max_tokens 1 and time it (time to first token, streamed). With the host tier the
# resumed history comes back by copy; without it, it is prefilled again. A "warm" time (history
# still in the GPU pool) is the floor. Also the tier's copy bandwidth from /metrics.
# usage: scripts/device-resume.sh BUNDLE_DIR   (SHAPE default llama-3.1-8b; GPU_KV / HOST_KV bytes;
#        LENS: history lengths in words, default "1000 2000 4000 8000")
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle "$1" rs
shape=${SHAPE:-llama-3.1-8b}
m=$(model_dir "$shape")
cat > /tmp/rs/client.py <<'PY'
import json, random, sys, time, urllib.request
url, lens = sys.argv[1], [int(x) for x in sys.argv[2].split()]
words = ("time river light stone garden window morning silver paper music forest letter summer "
         "winter market bridge engine harbor valley mirror candle shadow ocean thunder").split()
def text(seed, n):
    r = random.Random(seed)
    return " ".join(r.choice(words) for _ in range(n))
def ttft(prompt):
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if line.startswith(b"data: ") and b"choices" in line:
                return (time.perf_counter() - t0) * 1e3
    return float("nan")
def send(prompt, max_tokens=1):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))
for L in lens:
    hist = text(L, L)
    send(hist)                                   # cache the history
    warm = ttft(hist + " " + text(L + 1, 16))    # still in the GPU pool
    for f in range(int(sys.argv[3])):            # push it out
        send(text(10_000 + 97 * L + f, 4000))
    cold = ttft(hist + " " + text(L + 2, 16))
    print(json.dumps({"history_words": L, "warm_ms": round(warm, 1), "resumed_ms": round(cold, 1)}), flush=True)
PY
for mode in tier notier; do
    extra=(); [[ $mode == tier ]] && extra=(--kv-offload-memory ${HOST_KV:-34359738368})
    "$pg/peregrine" serve --port 0 --model "$m" --load-format dummy --kv-cache-memory ${GPU_KV:-2147483648} \
        "${extra[@]}" > $logs/serve-$mode.log 2>&1 & pid=$!
    url=$(wait_ready $logs/serve-$mode.log)
    grep -E "KV cache:|host tier" $logs/serve-$mode.log | sed "s/^/$mode: /"
    timeout 500 python3 /tmp/rs/client.py "$url" "${LENS:-1000 2000 4000 8000}" ${FILLERS:-6} | sed "s/^/$mode: /"
    curl -s "$url/metrics" | grep -E "^peregrine:(kv_(off|on)loaded_(blocks|bytes)|host_prefix_cache_hits|kv_.*seconds_(sum|count))" |
        sed "s/^/$mode: /"
    kill $pid; wait $pid 2>/dev/null
done
