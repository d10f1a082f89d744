#!/usr/bin/env bash
# `peregrine bench serve` end to end: start `peregrine serve` (the embedded model) on a free
# port, send 50 streamed requests at concurrency 8, and require zero failures; then a small
# multi-turn run that must see prefix-cache hits (the shared system prompt, the resent history).
# Usage: bench_serve_smoke.sh PEREGRINE_BINARY
set -euo pipefail
bin="$1"
work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$bin" serve --port 0 2>"$work/serve.log" &
server_pid=$!
url=""
for _ in $(seq 600); do
    url="$(grep -o 'ready: serving .* at http://[^ ]*/v1' "$work/serve.log" | grep -o 'http://[^ ]*/v1' || true)"
    [ -n "$url" ] && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "server exited before it was ready:" >&2
        cat "$work/serve.log" >&2
        exit 1
    fi
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "server not ready in 60 s:" >&2
    cat "$work/serve.log" >&2
    exit 1
fi

for endpoint in completions chat; do
    "$bin" bench serve --url "$url" --endpoint "$endpoint" --num-requests 50 --concurrency 8 \
        --prompt-len 16 --output-len 16 --json "$work/$endpoint.json"
    grep -q '"failed": 0,' "$work/$endpoint.json"
    grep -q '"completed": 50,' "$work/$endpoint.json"
    grep -q '"output_len_mismatches": 0,' "$work/$endpoint.json"
done
# Interleaved (completions: 4 users share 2 connections, each next turn queued behind the others')
# and sequential (chat) turn orders.
for endpoint in completions chat; do
    order=interleaved
    [[ $endpoint == chat ]] && order=sequential
    "$bin" bench serve --url "$url" --endpoint "$endpoint" --dataset multi-turn --num-users 4 --turns 3 \
        --system-prompt-len 64 --turn-len 16 --output-len 8 --concurrency 2 --turn-order $order \
        --json "$work/mt-$endpoint.json" >"$work/mt-$endpoint.txt"
    grep -q "\"turn_order\": \"$order\"" "$work/mt-$endpoint.json"
    cat "$work/mt-$endpoint.txt"
    grep -q '"failed": 0,' "$work/mt-$endpoint.json"
    grep -q '"completed": 12,' "$work/mt-$endpoint.json"
    grep -q '"output_len_mismatches": 0,' "$work/mt-$endpoint.json"
    # A rate above zero, e.g. "Prefix cache hit rate:   71.74%" (not "0.00%" or "n/a").
    grep -Eq '^Prefix cache hit rate: +(0*[1-9][0-9]*\.[0-9]+|0+\.(0*[1-9][0-9]*))%$' "$work/mt-$endpoint.txt"
    grep -Eq '"prefix_cache_hit_rate": 0?\.?[0-9]*[1-9]' "$work/mt-$endpoint.json"
    grep -q '"ttft_ms_by_turn": \[' "$work/mt-$endpoint.json"
done
echo "bench serve smoke: ok"
