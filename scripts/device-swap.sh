#!/usr/bin/env bash
# Swap preemption on the GPU (issue #21; device tool, repo root, a bundle of
# scripts/pack-device.sh in .device): llama3-tiny (real weights), --batch-invariant, 16
# concurrent greedy completions of 200 tokens over a KV pool of 24 blocks (they preempt each
# other), swap vs recompute vs a large pool: the texts must be equal and swaps counted.
# usage: scripts/device-swap.sh
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle .device sw
cat > /tmp/sw/client.py <<'PY'
import concurrent.futures, json, sys, urllib.request
url, out = sys.argv[1], sys.argv[2]
words = "the cat sat on a warm mat while the dog ran in the park and the birds sang songs".split()
def one(i):
    body = {"prompt": " ".join(words[i % 7:] + words[:i % 5]) + f" {i}", "max_tokens": 200, "temperature": 0,
            "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    texts = list(ex.map(one, range(16)))
json.dump(texts, open(out, "w"))
PY
m=tests/data/llama3-tiny
# llama3-tiny's KV block (16 tokens): read from the log of the large run.
for mode in big swap recompute; do
    case $mode in
        big) args=(--kv-cache-memory 268435456) ;;
        swap) args=(--kv-cache-memory $((24 * ${block:-0})) --kv-offload-memory 67108864 --preemption-mode swap) ;;
        recompute) args=(--kv-cache-memory $((24 * ${block:-0})) --kv-offload-memory 67108864 --preemption-mode recompute) ;;
    esac
    "$pg/peregrine" serve --port 0 --model $m --batch-invariant "${args[@]}" > "$logs/serve-$mode.log" 2>&1 &
    pid=$!
    url=$(wait_ready "$logs/serve-$mode.log")
    if [[ -z $url ]]; then echo "$mode: serve did not start"; tail -5 "$logs/serve-$mode.log"; kill $pid; continue; fi
    if [[ $mode == big ]]; then
        line=$(grep "KV cache:" "$logs/serve-$mode.log")
        # "KV cache: N blocks of 16 tokens (X MiB, ...)": bytes per block = X MiB / N
        block=$(python3 -c "import re,sys; m=re.search(r'(\d+) blocks of \d+ tokens \(([\d.]+) MiB', sys.argv[1]); print(int(float(m.group(2))*1048576/int(m.group(1))))" "$line")
        echo "KV block: $block bytes"
    fi
    timeout 200 python3 /tmp/sw/client.py "$url" "$logs/$mode.json"
    curl -s "$url/metrics" | grep -E "^peregrine:(num_preemptions|num_swap_preemptions|kv_swapped)" | sed "s/^/$mode: /"
    kill $pid
    wait $pid 2>/dev/null
done
python3 - "$logs" <<'PY'
import json, sys
d = sys.argv[1]
big, swap, rec = (json.load(open(f"{d}/{m}.json")) for m in ("big", "swap", "recompute"))
print(f"greedy texts equal to the large pool: swap {sum(a == b for a, b in zip(big, swap))}/16, "
      f"recompute {sum(a == b for a, b in zip(big, rec))}/16")
PY
