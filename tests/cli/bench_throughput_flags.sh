#!/usr/bin/env bash
# `peregrine bench throughput` flags of issue #25 on the embedded model: --json, --range-ratio,
# --seed, --batching static|continuous, --no-ignore-eos. Both batching modes must generate the
# same tokens for the same seed (only the admission differs), static must take more steps, and
# range-ratio lengths must vary within their bounds.
# Usage: bench_throughput_flags.sh PEREGRINE_BINARY
set -euo pipefail
bin="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(--device cpu --threads 1 -n 24 --max-num-seqs 4 --input-len 20 --output-len 30 --range-ratio 0.5
        --seed 7 --warmup 0 --iters 1)
"$bin" bench throughput "${common[@]}" --batching static --json "$work/static.json" >"$work/static.txt"
"$bin" bench throughput "${common[@]}" --batching continuous --json "$work/cont.json" >"$work/cont.txt"
"$bin" bench throughput "${common[@]}" --no-ignore-eos --json "$work/eos.json" >/dev/null
"$bin" bench latency --device cpu --threads 1 --batch-size 2 --input-len 8 --output-len 8 --warmup 0 --iters 1 \
    --json "$work/lat.json" >/dev/null
grep -q 'static batching' "$work/static.txt"
grep -q 'continuous batching' "$work/cont.txt"
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
s, c, e, l = (json.load(open(f"{w}/{n}.json")) for n in ("static", "cont", "eos", "lat"))
for key in ("elapsed_time", "num_requests", "total_num_tokens", "requests_per_second", "tokens_per_second"):
    assert key in s, key  # vLLM's --output-json keys
assert s["batching"] == "static" and c["batching"] == "continuous"
# 24 requests, outputs uniform in [15, 45]: same seed, same lengths, so the same token counts.
assert s["output_tokens"] == c["output_tokens"], (s["output_tokens"], c["output_tokens"])
assert s["prompt_tokens"] == c["prompt_tokens"]
assert 24 * 15 <= s["output_tokens"] <= 24 * 45 and s["output_tokens"] != 24 * 30, s["output_tokens"]
assert 24 * 10 <= s["prompt_tokens"] <= 24 * 30 and s["prompt_tokens"] != 24 * 20, s["prompt_tokens"]
assert s["steps"] > c["steps"], (s["steps"], c["steps"])  # static waits for each group's longest
assert e["ignore_eos"] is False and e["output_tokens"] <= s["output_tokens"]
assert l["batch_size"] == 2 and l["avg_latency"] > 0
print(f"bench throughput flags: static {s['steps']} steps, continuous {c['steps']} steps, "
      f"{s['output_tokens']} output tokens; without ignore_eos {e['output_tokens']}")
PY
