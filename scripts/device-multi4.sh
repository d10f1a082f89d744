#!/usr/bin/env bash
# Issue #24 on a machine of 2 or 4 GPUs (device tool, repo root), from a bundle of
# scripts/pack-device.sh. Every step has a timeout; one line per result, logs under $OUT/mg.
#   1. NCCL all-reduce bus bandwidth at decode-step message sizes, measured with the device's
#      PyTorch (torch.distributed over NCCL: not our code), 2 and 4 ranks.
#   2. Llama-3.1-8B shape: batch-1 decode TP 1 / 2 / 4; offline throughput (256 prompts) TP 1 / 2.
#   3. Llama-3.1-70B shape: TP 4 batch-1 decode and offline throughput (256 prompts).
#   4. DP_SHAPE (default llama-3.2-1b; a bench/models folder) served at concurrency 256: one replica
#      vs --data-parallel-size 2 and 4 (a GPU each, the router in front), with the client on
#      CLIENT_THREADS threads (default 8) and the front process's CPU (the router, for N > 1).
# usage: scripts/device-multi4.sh BUNDLE_DIR [STEPS]   (STEPS: a subset of "nccl 8b 70b dp")
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
steps=${2:-"nccl 8b 70b dp"}
mkdir -p /tmp/mg && tar -C /tmp/mg -xJf "$1/bundle.tar.xz"
pg=/tmp/mg/pg
export LD_LIBRARY_PATH=$pg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
logs=${OUT:-/tmp/mg}/mg && mkdir -p "$logs"
ngpu=$(nvidia-smi -L | wc -l)
source scripts/device-lib.sh
nvidia-smi -L
nvidia-smi topo -m | head -8
if [[ $steps == *nccl* ]]; then
    cat > /tmp/mg/allreduce.py <<'PY'
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
r, w = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(r)
for nbytes in [8 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 16 << 20, 64 << 20]:
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    for _ in range(20): dist.all_reduce(x)
    torch.cuda.synchronize()
    iters = 200 if nbytes <= (1 << 20) else 50
    t = time.perf_counter()
    for _ in range(iters): dist.all_reduce(x)
    torch.cuda.synchronize()
    s = (time.perf_counter() - t) / iters
    if r == 0:
        print(f"allreduce world {w} {nbytes:>9} B: {s * 1e6:8.1f} us, bus bandwidth {nbytes * 2 * (w - 1) / w / s / 1e9:7.1f} GB/s", flush=True)
dist.destroy_process_group()
PY
    for w in 2 4; do
        (( w > ngpu )) && continue
        timeout 120 python3 -m torch.distributed.run --nproc_per_node $w /tmp/mg/allreduce.py 2> $logs/nccl$w.err | grep allreduce
    done
fi
lat() {  # label model tp
    timeout 240 "$pg/peregrine" bench latency --model "$2" --load-format dummy --tensor-parallel-size $3 \
        --batch-size 1 --input-len 128 --output-len 128 > $logs/$1.log 2>&1
    echo "$1: rc $? $(grep -E '^latency \(best' $logs/$1.log)"
    grep -iE "error|NCCL WARN" $logs/$1.log | head -3
}
thr() {  # label model tp
    timeout 300 "$pg/peregrine" bench throughput --model "$2" --load-format dummy --tensor-parallel-size $3 \
        --num-prompts 256 --input-len 128 --output-len 128 > $logs/$1.log 2>&1
    echo "$1: rc $? $(grep -E '^throughput \(best' $logs/$1.log)"
    grep -iE "error|NCCL WARN" $logs/$1.log | head -3
}
if [[ $steps == *8b* ]]; then
    m8=$(model_dir llama-3.1-8b)
    for tp in 1 2 4; do (( tp <= ngpu )) && lat "8b_decode_tp$tp" "$m8" $tp; done
    for tp in 1 2; do (( tp <= ngpu )) && thr "8b_offline256_tp$tp" "$m8" $tp; done
fi
if [[ $steps == *70b* ]] && (( ngpu >= 4 )); then
    m70=$(model_dir llama-3.1-70b)
    lat 70b_decode_tp4 "$m70" 4
    thr 70b_offline256_tp4 "$m70" 4
fi
if [[ $steps == *dp* ]]; then
    mdp=$(model_dir ${DP_SHAPE:-llama-3.2-1b})
    seed=0
    for dp in 1 2 4; do
        (( dp > ngpu )) && continue
        "$pg/peregrine" serve --port 0 --model "$mdp" --load-format dummy --data-parallel-size $dp > $logs/serve$dp.log 2>&1 & pid=$!
        url=$(wait_ready $logs/serve$dp.log)
        # Concurrency 256 (the issue's figure), then 256 a replica (scaling); the first run warms up.
        # One replica also at 128: what each replica of DP 2 at 256 carries (DP 2's ceiling).
        cs="256 256 $((256 * dp))"
        (( dp == 1 )) && cs="256 256 256 128 128"
        run=0
        for c in $cs; do
            seed=$((seed + 1)) run=$((run + 1))
            c0=$(awk '{print $14+$15}' /proc/$pid/stat)
            timeout 200 "$pg/peregrine" bench serve --url "$url" --quiet --seed $seed --num-requests $((8 * c)) \
                --concurrency $c --client-threads ${CLIENT_THREADS:-8} --input-len 128 --output-len 128 \
                > $logs/dp$dp-$seed.txt 2>&1
            c1=$(awk '{print $14+$15}' /proc/$pid/stat)
            (( run > 1 )) && echo "DP $dp concurrency $c: $(grep -E 'Output token throughput' $logs/dp$dp-$seed.txt | tr -s ' ') $(grep -E 'Median TTFT' $logs/dp$dp-$seed.txt | tr -s ' ') $(grep -E 'Failed requests' $logs/dp$dp-$seed.txt | tr -s ' ') front process CPU $(( (c1 - c0) / 100 )) s in $(grep -E 'Benchmark duration' $logs/dp$dp-$seed.txt | grep -oE '[0-9.]+$') s"
        done
        kill $pid; wait $pid 2>/dev/null
    done
fi
