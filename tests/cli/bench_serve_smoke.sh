#!/usr/bin/env bash
# `peregrine bench serve` end to end: start `peregrine serve` (the embedded model) on a free
# port, send 50 streamed requests at concurrency 8, and require zero failures.
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
echo "bench serve smoke: ok"
