#!/usr/bin/env bash
# Issue #24 on a machine of 2 or more GPUs (device tool, repo root): tensor parallelism with the
# peer-memory all-reduce, and llama.cpp built there from source as the peer, in one call.
#   BUNDLE_DIR holds bundle.tar.xz (scripts/pack-device.sh), llamacpp-src.tar.xz (a `git archive`
#   of llama.cpp: CMakeLists.txt cmake ggml src include common examples pocs) and llamacpp-commit.
#   The peer's GGUFs get the Llama 3 vocabulary of tests/data/tokenizers.tar.xz.
# Steps (STEPS, default all): tests (the peer all-reduce and CUDA TP / PP tests, with its per-call
# timing), greedy (TP 1 vs TP 2 greedy ids on real tiny models, peer all-reduce on and off),
# ppids (PP 2, and TP 2 x PP 2 on 4 GPUs, greedy ids against TP 1), pp8 (8B shape PP 2 decode),
# 8b (Llama-3.1-8B shape batch-1 decode TP 1 / TP 2 / TP 2 NCCL only, twice alternating; offline
# 256 prompts TP 1 / TP 2), 70b (TP 2 on GPUs of >= 120 GiB), llamacpp (llama-bench -sm none /
# layer / row on the same shapes; with 4 GPUs also the 70B shape over all 4, its GGUF in
# /dev/shm). The llama.cpp build runs in the background from the start,
# at low priority, and is waited for before any timing. One line per result; the logs come back
# as $OUT/tp-logs.tar.xz (the device tool returns at most 8 files).
# usage: scripts/device-tp.sh BUNDLE_DIR [STEPS]   (ROUNDS=N 8b rounds, default 2; OFFLINE=0 skips 8b
#        offline; TPS="2 4" the 8b tensor-parallel sizes, default 2; TP70 the 70b's, default 2 or 4)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dir=$1
steps=${2:-"tests greedy 8b 70b llamacpp"}
t_start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t_start )) s] $*"; }
source scripts/device-lib.sh
OUT= unpack_bundle "$dir" tp  # logs in /tmp/tp/tp, packed into $OUT at the end
out=${OUT:-/tmp}
trap 'tar -C /tmp/tp -cJf "$out/tp-logs.tar.xz" tp' EXIT
nvidia-smi -L
nvidia-smi topo -m | head -4
gpu_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print int($1 / 1024)}')

# The peer's build and GGUFs, detached (setsid: they outlive this call, so a step `lcprep` in
# one call lets `llamacpp` in the next call on the same warm machine find them done); nice 19,
# all but 6 cores. Started once per machine (/tmp/lc/started).
lc_shapes=${LC_SHAPES:-"llama3.1-8b llama3.2-1b"}
if [[ ( $steps == *llamacpp* || $steps == *lcprep* ) && ! -f /tmp/lc/started ]]; then
    mkdir -p /tmp/lc /tmp/tok && touch /tmp/lc/started
    start_llamacpp_build "$dir/llamacpp-src.tar.xz" /tmp/lc
    tar -C /tmp/tok -xJf tests/data/tokenizers.tar.xz tokenizers/llama3
    # Its GGUFs: random bf16 weights of the bench/models shapes with the Llama 3 vocabulary; the
    # 70B's 141 GB in memory where /dev/shm allows (the 4-GPU machines have 512 GB), one
    # random chunk repeated.
    cat > /tmp/lc/gguf.sh <<EOS
cd $PWD
for s in $lc_shapes; do
    if [[ \$s == llama3.1-70b ]]; then
        big=/tmp/lc  # /dev/shm where it has room (a container's may be 64 MB)
        (( \$(df -k --output=avail /dev/shm | tail -1) > 150000000 )) && big=/dev/shm
        nice -n 10 python3 scripts/make_random_gguf.py /tmp/tok/tokenizers/llama3/tokenizer.json \$big/\$s.gguf --shape \$s --dtype bf16 --reuse-random > /tmp/lc/gguf-\$s.log 2>&1
        [[ \$big == /tmp/lc ]] || ln -sf \$big/\$s.gguf /tmp/lc/\$s.gguf
    else
        nice -n 10 python3 scripts/make_random_gguf.py /tmp/tok/tokenizers/llama3/tokenizer.json /tmp/lc/\$s.gguf --shape \$s --dtype bf16 > /tmp/lc/gguf-\$s.log 2>&1
    fi
done
touch /tmp/lc/gguf-done
EOS
    setsid nohup bash /tmp/lc/gguf.sh > /dev/null 2>&1 < /dev/null &
fi

if [[ $steps == *tests* ]]; then
    PG_PEER_BENCH=1 timeout 180 "$pg/peregrine_cuda_tests" --gtest_filter='PeerCollectives.*:*CudaTensorParallel*' > $logs/tests.log 2>&1
    stamp "tests: rc $? $(grep -E '^\[  (PASSED|FAILED) ' $logs/tests.log | tr '\n' ' ')"
    grep -E "peer all-reduce|tensor parallel:|FAILED|Failure|rank .* floats|bits differ|^\[==========\]" $logs/tests.log | head -30
fi

if [[ $steps == *greedy* ]]; then
    for m in llama3-tiny qwen2-tiny qwen3-tiny; do
        for run in "1" "2" "2 --disable-custom-all-reduce"; do
            tag=$(echo "$run" | tr -d ' -')
            timeout 120 "$pg/peregrine" generate --model tests/data/$m --tensor-parallel-size $run --prompt "Hello world, this is" \
                --max-tokens 32 --temperature 0 --json 2> $logs/g-$m-$tag.err | tail -1 > $logs/g-$m-$tag.json
        done
        python3 -c "
import json
ids = lambda t: json.load(open('$logs/g-$m-' + t + '.json'))['ids']
a, b, c = ids('1'), ids('2'), ids('2disablecustomallreduce')
print('$m greedy ids: TP1 == TP2 (peer all-reduce):', a == b, sum(x == y for x, y in zip(a, b)), '/', len(a),
      '; TP1 == TP2 (NCCL):', a == c, sum(x == y for x, y in zip(a, c)), '/', len(a))" || tail -3 $logs/g-$m-2.err
        grep -h "tensor parallel:" $logs/g-$m-2.err | head -1
    done
fi

if [[ $steps == *ppids* ]]; then
    ngpu=$(nvidia-smi -L | wc -l)
    for m in llama3-tiny qwen2-tiny qwen3-tiny; do
        runs=("--tensor-parallel-size 1" "--pipeline-parallel-size 2")
        (( ngpu >= 4 )) && runs+=("--tensor-parallel-size 2 --pipeline-parallel-size 2")
        for run in "${runs[@]}"; do
            tag=$(echo "$run" | tr -d ' -' | sed 's/parallelsize//g')
            timeout 120 "$pg/peregrine" generate --model tests/data/$m $run --prompt "Hello world, this is" \
                --max-tokens 32 --temperature 0 --json 2> $logs/pg-$m-$tag.err | tail -1 > $logs/pg-$m-$tag.json
            python3 -c "
import json
ids = lambda t: json.load(open('$logs/pg-$m-' + t + '.json'))['ids']
a, b = ids('tensor1'), ids('$tag')
print('$m greedy ids: $run == TP 1:', a == b, sum(x == y for x, y in zip(a, b)), '/', len(a))" || tail -3 $logs/pg-$m-$tag.err
        done
    done
    grep -h "pipeline parallel" $logs/pg-llama3-tiny-*.err | head -2
fi

if [[ $steps == *llamacpp* ]]; then
    while [[ ! -f /tmp/lc/rc || ! -f /tmp/lc/gguf-done ]]; do sleep 5; done
    stamp "llama.cpp build rc $(cat /tmp/lc/rc 2>/dev/null || echo none) (commit: $(cat "$dir/llamacpp-commit" 2>/dev/null))"
    tail -3 /tmp/lc/build.log
    ls -la /tmp/lc/*.gguf
fi

# bench KIND LABEL MODEL TP [flags]: `peregrine bench latency` (batch 1) or `bench throughput`
# (256 prompts), 128-token prompts and outputs, random weights; one line with its result.
bench() {
    local kind=$1 label=$2 model=$3 tp=$4 size limit
    shift 4
    if [[ $kind == latency ]]; then size=(--batch-size 1) limit=240; else size=(--num-prompts 256) limit=300; fi
    timeout $limit "$pg/peregrine" bench $kind --model "$model" --load-format dummy --tensor-parallel-size $tp "$@" \
        "${size[@]}" --input-len 128 --output-len 128 > $logs/$label.log 2>&1
    stamp "$label: rc $? $(grep -E "^$kind \(best" $logs/$label.log)"
    grep -iE "error|NCCL WARN|NCCL only" $logs/$label.log | head -3
}
lat() { bench latency "$@"; }
thr() { bench throughput "$@"; }
if [[ $steps == *8b* ]]; then
    m8=$(model_dir llama-3.1-8b)
    for round in $(seq ${ROUNDS:-2}); do
        lat 8b_tp1_r$round "$m8" 1
        for tp in ${TPS:-2}; do
            lat 8b_tp${tp}_peer_r$round "$m8" $tp
            lat 8b_tp${tp}_nccl_r$round "$m8" $tp --disable-custom-all-reduce
        done
    done
    grep -h "tensor parallel:" $logs/8b_tp2_peer_r1.log | head -1
    if [[ ${OFFLINE:-1} == 1 ]]; then
        thr 8b_offline256_tp1 "$m8" 1
        thr 8b_offline256_tp2 "$m8" 2
    fi
fi
# The 70B's bf16 weights need 2 GPUs of >= 120 GiB, or 4.
tp70=${TP70:-$( (( gpu_gib >= 120 )) && echo 2 || echo 4)}
if [[ $steps == *pp8* ]]; then
    m8=$(model_dir llama-3.1-8b)
    lat 8b_tp1 "$m8" 1
    lat 8b_pp2 "$m8" 1 --pipeline-parallel-size 2
fi
if [[ $steps == *70b* ]] && (( tp70 <= $(nvidia-smi -L | wc -l) )); then
    m70=$(model_dir llama-3.1-70b)
    lat 70b_tp${tp70}_peer "$m70" $tp70
    [[ ${NCCL70:-1} == 1 ]] && lat 70b_tp${tp70}_nccl "$m70" $tp70 --disable-custom-all-reduce
    # Tensor 2 x pipeline 2 beside tensor 4, on 4 GPUs.
    if (( $(nvidia-smi -L | wc -l) >= 4 )); then
        lat 70b_tp2pp2 "$m70" 2 --pipeline-parallel-size 2
        if [[ ${OFFLINE70:-1} == 1 ]]; then
            thr 70b_offline256_tp4 "$m70" 4
            thr 70b_offline256_tp2pp2 "$m70" 2 --pipeline-parallel-size 2
        fi
    fi
fi
if [[ $steps == *llamacpp* && -x /tmp/lc/llama.cpp/build/bin/llama-bench ]]; then
    lb=/tmp/lc/llama.cpp/build/bin/llama-bench
    for s in $lc_shapes; do
        # GPUs: -sm none on GPU 0 alone; the splits over LC_GPUS (default 0,1); the 70B over all 4.
        gpus=${LC_GPUS:-0,1} modes="none layer row"
        [[ $s == llama3.1-70b ]] && gpus=0,1,2,3 modes="layer row"
        for sm in $modes; do
            CUDA_VISIBLE_DEVICES=$([[ $sm == none ]] && echo 0 || echo $gpus) timeout 400 $lb -m /tmp/lc/$s.gguf -ngl 99 -fa 1 \
                -sm $sm -p 512 -n 128 -r ${LC_REPS:-3} -o md > $logs/lc-$s-$sm.md 2> $logs/lc-$s-$sm.err
            stamp "llama.cpp $s -sm $sm on GPUs $([[ $sm == none ]] && echo 0 || echo $gpus): rc $?"
            grep -E "pp512|tg128" $logs/lc-$s-$sm.md
        done
    done
fi
stamp done
