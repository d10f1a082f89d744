#!/usr/bin/env bash
# Follow-up checks on a 2-GPU machine (bundle of scripts/pack-device.sh, unpacked by
# scripts/device-multi.sh into /tmp/mg, or here): greedy tokens of real tiny models TP 1 vs TP 2
# over NCCL (dummy weights differ per TP rank, so only real weights compare), and the router's
# ceiling: one replica at concurrency 256 directly and through `peregrine router`, with the
# router's CPU use.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[[ -x /tmp/mg/pg/peregrine ]] || { mkdir -p /tmp/mg && tar -C /tmp/mg -xJf "$1/bundle.tar.xz"; }
pg=/tmp/mg/pg
export LD_LIBRARY_PATH=$pg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
logs=/tmp/mg/logs2 && mkdir -p $logs
for m in llama3-tiny qwen2-tiny qwen3-tiny; do
    for tp in 1 2; do
        timeout 120 "$pg/peregrine" generate --model tests/data/$m --tensor-parallel-size $tp --prompt "Hello world, this is" \
            --max-tokens 32 --temperature 0 --json 2> $logs/$m-$tp.err | tail -1 > $logs/$m-$tp.json
    done
    python3 -c "
import json
a=json.load(open('$logs/$m-1.json'))['ids']; b=json.load(open('$logs/$m-2.json'))['ids']
print('$m: greedy ids TP1 == TP2:', a == b, sum(x == y for x, y in zip(a, b)), '/', len(a))" || tail -3 $logs/$m-2.err
done
m1=/tmp/models/llama-3.2-1b
ready() { for _ in $(seq 600); do u=$(grep -v '^replica ' "$1" | grep -oE "ready: (serving '[^']*' at|routing at) http://[0-9.:]+" | grep -oE 'http://[0-9.:]+' | tail -1); [[ -n $u ]] && { echo $u; return; }; sleep 0.5; done; }
"$pg/peregrine" serve --port 0 --model "$m1" --load-format dummy > $logs/one.log 2>&1 & pid=$!
url=$(ready $logs/one.log)
"$pg/peregrine" router --port 0 --backend "$url" > $logs/router.log 2>&1 & rpid=$!
rurl=$(ready $logs/router.log)
for target in direct router direct router; do
    u=$url; [[ $target == router ]] && u=$rurl
    (sleep 3; top -b -n 1 -p $rpid | tail -1 > $logs/top-$target.txt) &
    timeout 200 "$pg/peregrine" bench serve --url "$u" --quiet --num-requests 2048 --concurrency 256 \
        --input-len 128 --output-len 128 > $logs/b-$target.txt 2>&1
    echo "$target: $(grep -E 'Output token throughput' $logs/b-$target.txt | tr -s ' ') $(grep -E 'Median TTFT' $logs/b-$target.txt | tr -s ' ') router cpu: $(awk '{print $9}' $logs/top-$target.txt)%"
done
kill $rpid $pid; wait 2>/dev/null
