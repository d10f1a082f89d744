#!/bin/bash
# Cache-aware vs round-robin routing on the CPU: 2 replicas (1 thread each) of the embedded model
# behind `peregrine router`, the multi-turn workload, fresh replicas per run, policies alternating.
# usage: scripts/bench-routing-cpu.sh [BINARY]
#   KV="--kv-cache-memory N"   cap each replica's KV pool (bytes)
#   WORKLOAD="..."             bench serve's multi-turn flags (default below)
#   ROUNDS=N                   rounds of both policies (default 2)
#   RARGS="..."                more `peregrine router` flags (e.g. --prefix-weight 2)
#   POLICIES="..."             the policies to run (default "cache-aware round-robin")
B=${1:-build/peregrine}
L=/tmp/cpub; mkdir -p $L
WORKLOAD=${WORKLOAD:---num-users 24 --turns 5 --system-prompt-len 16 --turn-len 20 --output-len 16 --concurrency 8}
ready() { for _ in $(seq 200); do u=$(grep -oE "ready: (serving '[^']*' at|routing at) http://[0-9.:]+" $1 | grep -oE 'http://[0-9.:]+' | head -1); [ -n "$u" ] && { echo $u; return; }; sleep 0.1; done; }
echo "workload: $WORKLOAD; KV: ${KV:-default}"
for round in $(seq ${ROUNDS:-2}); do
  for policy in ${POLICIES:-cache-aware round-robin}; do
    $B serve --port 0 --device cpu --threads 1 $KV > $L/r1.log 2>&1 & p1=$!
    $B serve --port 0 --device cpu --threads 1 $KV > $L/r2.log 2>&1 & p2=$!
    u1=$(ready $L/r1.log); u2=$(ready $L/r2.log)
    $B router --port 0 --policy $policy --backend $u1 --backend $u2 ${RARGS:-} > $L/router.log 2>&1 & pr=$!
    ur=$(ready $L/router.log)
    $B bench serve --url $ur --quiet --dataset multi-turn $WORKLOAD --metrics-url $u1 --metrics-url $u2 \
      --json $L/$policy-$round.json > $L/$policy-$round.txt 2>&1
    python3 -c "
import json; j=json.load(open('$L/$policy-$round.json'))
print('%-11s round $round: hit rate %.3f (hits %d / queries %d), mean TTFT %.2f ms (turn 1 %.2f, later %.2f), p99 TTFT %.2f ms, completed %d failed %d' % ('$policy', j['prefix_cache_hit_rate'] or 0, j['prefix_cache_hits'], j['prefix_cache_queries'], j['mean_ttft_ms'], j['mean_ttft_ms_first_turn'] or 0, j['mean_ttft_ms_later_turns'] or 0, j['p99_ttft_ms'], j['completed'], j['failed']))"
    # The replicas' own view (arrival at the replica to its first token): queue + prefill.
    for u in $u1 $u2; do curl -s $u/metrics; done | python3 -c "
import re, sys
t = {}
for l in sys.stdin:
    m = re.match(r'peregrine:(time_to_first_token|request_queue_time|request_prefill_time)_seconds_(sum|count)\{[^}]*\} (\S+)', l)
    if m: t[m[1], m[2]] = t.get((m[1], m[2]), 0) + float(m[3])
print('  replicas: ' + ', '.join('%s %.2f ms' % (k.replace('request_', '').replace('_time', ''), 1e3 * t[k, 'sum'] / t[k, 'count'])
      for k in ('time_to_first_token', 'request_queue_time', 'request_prefill_time') if t.get((k, 'count'))))"
    curl -s $ur/metrics | grep -E '^peregrine_router:(routing_decisions_total|prefix_index_(replica|capacity)_keys|requests_total)' \
      | sed 's/^peregrine_router://' | tr '\n' ' ' | sed 's/^/  router: /; s/$/\n/'
    kill $pr $p1 $p2; wait $pr $p1 $p2 2>/dev/null
  done
done
grep -h "KV cache\|blocks" $L/r1.log | head -2
