#!/usr/bin/env bash
# Issue #23 on one GPU (device tool, repo root): GGUF files kept quantized on the GPU against
# llama.cpp built there from source, same machine, same call. Steps (default all):
#   prep   starts, detached (setsid: a later call on the same warm machine finds them), the
#          llama.cpp build (llama-bench) and the random GGUFs of make_random_gguf.py
#          (Llama-3.1-8B and 3.2-1B shapes, q4_k_m and q8_0, Llama 3 vocabulary)
#   tests  the GGUF kernel tests and the golden fixtures on the GPU (GPU_FILTER overrides)
#   bench  `peregrine bench latency --batch-size 1` (128 in / 128 out, best of 3) on each GGUF
#          under each GGUF_GEMV policy (default "blocks persistent") and Q6K layout (default 6bit, the engine's), then llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 2 on the same files
#   batched offline throughput (256 x 128 in / 128 out) and prefill (64 x 512 in, 8192-token
#          steps) of each GGUF kept quantized and with --dequantize-gguf, same call
#   curve  decode tok/s over all sequences at BATCHES (default "1 2 4 8 16 32"), 128 in / 128
#          out: ours (`bench latency --batch-size B`, best of 2) beside llama-batched-bench
#          (-npp 128 -ntg 128 -npl B,..., -ngl 99 -fa 1: its S_TG t/s column) on the same files
# BUNDLE_DIR holds bundle.tar.xz (scripts/pack-device.sh) and llamacpp-src.tar.xz (a `git
# archive` of llama.cpp; PEER_DIR: another carried folder holding it). Where the two pass the
# 64 MiB the device tool carries, a first call carries PEER_DIR alone and runs "prep" (the
# build and the GGUFs go on detached), and a second on the still-warm machine (within its idle
# release) carries the bundle and runs the rest. One line per result; logs come back as
# $OUT/gguf-logs.tar.xz.
# usage: scripts/device-gguf.sh BUNDLE_DIR [STEPS]   (default "prep tests bench"; LLAMACPP=0: no peer; SHAPES="llama3.1-8b
#        llama3.2-1b", TYPES="q4_k_m q8_0")
set -uo pipefail
dir=$1
steps=${2:-"prep tests bench"}
t_start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t_start )) s] $*"; }
# Waits for the detached llama.cpp build of "prep" (LLAMACPP=0: no peer) until DEADLINE seconds
# since this call's start (default 570), then says how it ended.
wait_peer_build() {
    while [[ ${LLAMACPP:-1} == 1 && ! -f /tmp/lcg/rc ]] && (( $(date +%s) - t_start < ${DEADLINE:-570} )); do sleep 5; done
    stamp "llama.cpp build rc $(cat /tmp/lcg/rc 2>/dev/null || echo 'not done'; tail -1 /tmp/lcg/build.log 2>/dev/null)"
}
source scripts/device-lib.sh
if [[ -f $dir/bundle.tar.xz ]]; then OUT= unpack_bundle "$dir" gguf; else logs=/tmp/gguf/gguf; mkdir -p $logs; fi  # absent: "prep" alone
out=${OUT:-/tmp}
trap 'tar -C /tmp/gguf -cJf "$out/gguf-logs.tar.xz" gguf' EXIT
export PG_TEST_DATA_DIR=$PWD/tests/data PG_MODELS_DIR=$PWD/models PEREGRINE_MODELS=$PWD/models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
shapes=${SHAPES:-"llama3.1-8b llama3.2-1b"}
types=${TYPES:-"q4_k_m q8_0"}

if [[ $steps == *prep* && ! -f /tmp/lcg/started ]]; then
    mkdir -p /tmp/lcg /tmp/tok && touch /tmp/lcg/started
    [[ ${LLAMACPP:-1} == 1 ]] && start_llamacpp_build "${PEER_DIR:-$dir}/llamacpp-src.tar.xz" /tmp/lcg
    tar -C /tmp/tok -xJf tests/data/tokenizers.tar.xz tokenizers/llama3
    cat > /tmp/lcg/gguf.sh <<EOS
cd $PWD
for s in $shapes; do for t in $types; do
    nice -n 10 python3 scripts/make_random_gguf.py /tmp/tok/tokenizers/llama3/tokenizer.json /tmp/lcg/\$s-\$t.gguf --shape \$s --dtype \$t --reuse-random > /tmp/lcg/gguf-\$s-\$t.log 2>&1
done; done
touch /tmp/lcg/gguf-done
EOS
    setsid nohup bash /tmp/lcg/gguf.sh > /dev/null 2>&1 < /dev/null &
fi

if [[ $steps == *tests* ]]; then
    filter=${GPU_FILTER:-'CudaGemv.GgufLayouts*:CudaGemv.EveryEntryPoint*:CudaGemv.Fp8*:GpuGolden.*:GpuModel.*'}
    timeout 300 "$pg/peregrine_cuda_tests" --gtest_filter="$filter" > $logs/tests.log 2>&1
    stamp "tests: rc $? $(grep -E '^\[  (PASSED|FAILED) ' $logs/tests.log | tr '\n' ' ')"
    grep -E "^gpu |FAILED|Failure|dequantize_weight|Expected|Which is" $logs/tests.log | head -60
fi

if [[ $steps == *bench* ]]; then
    while [[ ! -f /tmp/lcg/gguf-done ]]; do sleep 3; done
    ls -la /tmp/lcg/*.gguf
    [[ ${BASELINE:-1} == 1 ]] && for s in $shapes; do  # bf16 random weights of the shape, same call
        m=$(model_dir "$(echo "$s" | sed 's/^llama3\./llama-3./')")  # bench/models/llama-3.1-8b
        timeout 200 "$pg/peregrine" bench latency --model $m --load-format dummy --batch-size 1 --input-len 128 --output-len 128 > $logs/pg-$s-bf16.log 2>&1
        stamp "ours $s bf16 (dummy): rc $? $(grep -E '^latency \(best' $logs/pg-$s-bf16.log)"
    done
    # GGUF_GEMV="blocks persistent": the decode products' launch policies (PEREGRINE_GGUF_GEMV), each run.
    # Q6K="int8 6bit": Q6_K's device layout (PEREGRINE_Q6K_LAYOUT), each run; default 6bit only (the engine's default since session 17).
    for s in $shapes; do for t in $types; do for g in ${GGUF_GEMV:-blocks persistent}; do for q in ${Q6K:-6bit}; do
        f=/tmp/lcg/$s-$t.gguf
        PEREGRINE_GGUF_GEMV=$g PEREGRINE_Q6K_LAYOUT=$q timeout 300 "$pg/peregrine" bench latency --model $f --batch-size 1 \
            --input-len 128 --output-len 128 > $logs/pg-$s-$t-$g-$q.log 2>&1
        stamp "ours $s $t ($g, q6k $q): rc $? $(grep -E '^latency \(best' $logs/pg-$s-$t-$g-$q.log)"
        grep -iE "weights|error" $logs/pg-$s-$t-$g-$q.log | head -3
    done; done; done; done
    # DEADLINE (seconds since the start, default 570): stop waiting for the peer's build there.
    # LLAMACPP=0: no peer build or run (ours only, e.g. a second call on the same day).
    wait_peer_build
    lb=/tmp/lcg/llama.cpp/build/bin/llama-bench
    [[ -x $lb ]] && for s in $shapes; do for t in $types; do
        timeout 200 $lb -m /tmp/lcg/$s-$t.gguf -ngl 99 -fa 1 -p 512 -n 128 -r ${LC_REPS:-2} -o md > $logs/lc-$s-$t.md 2> $logs/lc-$s-$t.err
        stamp "llama.cpp $s $t: rc $?"
        grep -E "pp512|tg128" $logs/lc-$s-$t.md
    done; done
fi
if [[ $steps == *batched* ]]; then
    while [[ ! -f /tmp/lcg/gguf-done ]]; do sleep 3; done
    # MODES (default "kept dequantized"): kept quantized, --dequantize-gguf (bf16 weights), and
    # kept-gemm64 (kept, but products past 64 rows dequantized for cuBLASLt each step: the path
    # before gguf_gemm took every size, PEREGRINE_GGUF_GEMM_MAX_ROWS=64).
    for s in $shapes; do for t in $types; do for mode in ${MODES:-kept dequantized}; do
        f=/tmp/lcg/$s-$t.gguf flag=() max=
        [[ $mode == dequantized ]] && flag=(--dequantize-gguf)
        [[ $mode == kept-gemm64 ]] && max=64
        env ${max:+PEREGRINE_GGUF_GEMM_MAX_ROWS=$max} timeout 300 "$pg/peregrine" bench throughput --model $f "${flag[@]}" \
            --num-prompts 256 --input-len 128 --output-len 128 --iters 2 > $logs/off-$s-$t-$mode.log 2>&1
        stamp "offline $s $t $mode: rc $? $(grep -E '^throughput \(best' $logs/off-$s-$t-$mode.log)"
        env ${max:+PEREGRINE_GGUF_GEMM_MAX_ROWS=$max} timeout 300 "$pg/peregrine" bench throughput --model $f "${flag[@]}" \
            --num-prompts 64 --input-len 512 --output-len 1 --max-num-batched-tokens 8192 > $logs/pre-$s-$t-$mode.log 2>&1
        stamp "prefill $s $t $mode: rc $? $(grep -E '^throughput \(best' $logs/pre-$s-$t-$mode.log)"
    done; done; done
fi
if [[ $steps == *curve* ]]; then
    while [[ ! -f /tmp/lcg/gguf-done ]]; do sleep 3; done
    batches=${BATCHES:-"1 2 4 8 16 32"}
    for s in $shapes; do for t in $types; do for b in $batches; do
        timeout 200 "$pg/peregrine" bench latency --model /tmp/lcg/$s-$t.gguf --batch-size $b --input-len 128 \
            --output-len 128 --iters 2 > $logs/curve-$s-$t-$b.log 2>&1
        stamp "ours $s $t b$b: rc $? $(grep -E '^latency \(best' $logs/curve-$s-$t-$b.log | grep -oE 'decode [0-9.]+ tok/s')"
    done; done; done
    wait_peer_build
    bb=/tmp/lcg/llama.cpp/build/bin/llama-batched-bench
    max=$(tr ' ' '\n' <<< "$batches" | sort -n | tail -1)
    [[ -x $bb ]] && for s in $shapes; do for t in $types; do
        timeout 300 $bb -m /tmp/lcg/$s-$t.gguf -ngl 99 -fa -c $(( max * 256 + 256 )) -b 2048 -ub 512 -npp 128 -ntg 128 \
            -npl "$(tr ' ' ',' <<< "$batches")" > $logs/lcb-$s-$t.log 2>&1
        stamp "llama-batched-bench $s $t: rc $? (S_TG t/s: decode over all sequences)"
        grep -E '^\|' $logs/lcb-$s-$t.log
    done; done
fi
stamp done
