#!/usr/bin/env bash
# Runs on the GPU machine (through the device tool, from the repo root), over a build packed
# here by scripts/pack-device.sh: the CUDA tests, compute-sanitizer on the kernel tests, and
# the benchmarks of issue #7 on the Llama 3.2 1B / 3.1 8B shapes (random bf16 weights), then
# prints a short table. Logs go to $OUT (or /tmp/out).
# usage: scripts/device-check.sh [tests] [memcheck] [bench] [decode] [nopdl] [fp8] [fp8depth] [bench8b] [serve] [profile]
#        (decode: batch-1 decode of the 1B, the 8B and Qwen3 1.7B)
#        (default: all but profile; profile = per-kernel times of 1B decode steps under ncu)
set -uo pipefail
root=$(pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/pg
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(tests memcheck bench bench8b serve)
want() { local s; for s in "${steps[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }

# The bundle comes from PG_DEVICE_DIR (default .device, the carried folder); a warm machine may
# still hold an older one, so each bundle unpacks into its own folder.
bundle=${PG_DEVICE_DIR:-.device}/bundle.tar.xz
sum=$(md5sum "$bundle" | cut -c1-12)
[[ -x /tmp/pg/$sum/pg/peregrine ]] || { mkdir -p "/tmp/pg/$sum" && tar -C "/tmp/pg/$sum" -xJf "$bundle"; }
pg=/tmp/pg/$sum/pg
export LD_LIBRARY_PATH=$pg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PG_TEST_DATA_DIR=$root/tests/data PG_MODELS_DIR=$root/models PEREGRINE_MODELS=$root/models
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
table=()

if want tests; then
    "$pg/peregrine_cuda_tests" ${PG_GTEST_FILTER:+--gtest_filter=$PG_GTEST_FILTER} > "$out/cuda_tests.log" 2>&1
    rc=$?
    grep -E '^\[  FAILED  \]|^gpu |^\[  PASSED  \]|^\[  SKIPPED \]' "$out/cuda_tests.log" | head -60
    table+=("cuda tests: exit $rc, $(grep -c '^\[       OK \]' "$out/cuda_tests.log") ok, $(grep -c '^\[  FAILED  \]' "$out/cuda_tests.log") failed lines")
fi
if want memcheck; then
    # Left out: whole-model accuracy runs (thousands of steps of kernels the kernel tests cover;
    # the *TextTrained* ones decode 2,048 positions a model), the perf reports, and the NCCL
    # wrapper's tests (ncclCommInitRank probes kernels its library has no image for: the sanitizer
    # counts each cudaErrorNoKernelImageForDevice as an error, 4 a test, none of them ours).
    compute-sanitizer --tool memcheck --error-exitcode 3 "$pg/peregrine_cuda_tests" \
        --gtest_filter='-GpuGolden*:GpuEngine*:GpuModel*:*TextTrained*:CudaAttentionPerf*:Nccl*:CudaSampling.LargeVocabularyDistribution:CudaSampling.FullBatchOfMixedRows' > "$out/memcheck.log" 2>&1
    rc=$?
    tail -5 "$out/memcheck.log"
    table+=("compute-sanitizer memcheck (kernel tests): exit $rc, $(grep -m1 -o 'ERROR SUMMARY: [0-9]* errors' "$out/memcheck.log")")
fi

model_dir() {  # a dummy-weight model folder: bench/models/NAME/config.json + its family's tokenizer
    local d=/tmp/models/$1 tk=llama3
    [[ $1 == qwen3* ]] && tk=qwen3
    if [[ ! -f $d/config.json ]]; then
        mkdir -p "$d" /tmp/tok
        cp "bench/models/$1/config.json" "$d/"
        [[ -d /tmp/tok/tokenizers/$tk ]] || tar -C /tmp/tok -xJf tests/data/tokenizers.tar.xz "tokenizers/$tk"
        cp "/tmp/tok/tokenizers/$tk/"tokenizer*.json "$d/"
    fi
    echo "$d"
}
run_bench() {  # name, then peregrine arguments
    local name=$1; shift
    "$pg/peregrine" bench "$@" --load-format dummy > "$out/$name.log" 2>&1
    local rc=$?
    local line
    line=$(grep -E '^(throughput|latency) \(best' "$out/$name.log" | tail -1)
    [[ $rc -ne 0 ]] && line="exit $rc: $(tail -2 "$out/$name.log" | tr '\n' ' ')"
    echo "$name: $line"
    table+=("$name: $line")
}
if want bench; then
    m=$(model_dir llama-3.2-1b)
    run_bench 1b_decode_b1 latency --model "$m" --batch-size 1 --input-len 128 --output-len 128
    run_bench 1b_offline_256 throughput --model "$m" --num-prompts 256 --input-len 128 --output-len 128 --iters 2
    run_bench 1b_prefill_512 throughput --model "$m" --num-prompts 64 --input-len 512 --output-len 1 \
        --max-num-batched-tokens 8192
fi
if want decode; then  # batch-1 decode alone, 1B and 8B (PG_TAG names the logs: compare variants)
    m=$(model_dir llama-3.2-1b)
    run_bench "1b_decode_b1${PG_TAG:-}" latency --model "$m" --batch-size 1 --input-len 128 --output-len 128
    m=$(model_dir llama-3.1-8b)
    run_bench "8b_decode_b1${PG_TAG:-}" latency --model "$m" --batch-size 1 --input-len 128 --output-len 128
    m=$(model_dir qwen3-1.7b)  # q / k / v apart (qk-norm): the unfused RoPE + attention path
    run_bench "qwen3_1.7b_decode_b1${PG_TAG:-}" latency --model "$m" --batch-size 1 --input-len 128 --output-len 128
fi
if want nopdl; then  # the same decode with programmatic dependent launch off, for comparison
    m=$(model_dir llama-3.2-1b)
    PEREGRINE_PDL=0 run_bench 1b_decode_b1_nopdl latency --model "$m" --batch-size 1 --input-len 128 --output-len 128
fi
if want fp8; then  # --quantization fp8 (and with --fp8-lm-head) beside bf16 (issue #23): decode, offline, prefill
    # (FP8_DECODE_ONLY=1: decode alone)
    for shape in llama-3.2-1b llama-3.1-8b; do
        m=$(model_dir "$shape")
        tag=${shape#llama-}
        for q in none fp8 fp8head; do
            args=(--quantization "${q%head}")
            [[ $q == fp8head ]] && args+=(--fp8-lm-head)
            run_bench "${tag}_decode_b1_$q" latency --model "$m" --batch-size 1 --input-len 128 --output-len 128 \
                "${args[@]}"
            [[ -n ${FP8_DECODE_ONLY:-} ]] && continue
            run_bench "${tag}_offline_256_$q" throughput --model "$m" --num-prompts 256 --input-len 128 \
                --output-len 128 --iters 2 "${args[@]}"
            run_bench "${tag}_prefill_512_$q" throughput --model "$m" --num-prompts 64 --input-len 512 \
                --output-len 1 --max-num-batched-tokens 8192 "${args[@]}"
        done
    done
fi
if want fp8depth; then  # the persistent decode kernel's FP8 depth (gemv.cu fp8_persistent_depth)
    for shape in llama-3.2-1b llama-3.1-8b; do
        m=$(model_dir "$shape")
        for d in half same double; do
            PEREGRINE_FP8_PERSISTENT_DEPTH=$d run_bench "${shape#llama-}_decode_b1_fp8_$d" latency --model "$m" \
                --batch-size 1 --input-len 128 --output-len 128 --quantization fp8
        done
    done
fi
if want bench8b; then
    m=$(model_dir llama-3.1-8b)
    run_bench 8b_decode_b1 latency --model "$m" --batch-size 1 --input-len 128 --output-len 128
fi
if want profile; then
    # Per-kernel time and DRAM bytes of eager decode steps (the graph holds the same kernels),
    # after load, profiling and prefill. PG_PROFILE_MODEL picks the shape (default the 1B),
    # PG_PROFILE_ARGS adds flags (e.g. "--quantization fp8"; the outputs get a tag from them).
    pm=${PG_PROFILE_MODEL:-llama-3.2-1b}
    tag=$pm$(tr -c 'A-Za-z0-9\n' '_' <<< "${PG_PROFILE_ARGS:-}")
    m=$(model_dir "$pm")
    count=$([[ $pm == llama-3.2-1b ]] && echo 460 || echo 660)  # about 5 (1B) or 4 (8B) steps
    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
        --launch-skip 1500 --launch-count "$count" \
        "$pg/peregrine" bench latency --model "$m" --load-format dummy --warmup 0 --iters 1 --output-len 60 \
        --enforce-eager ${PG_PROFILE_ARGS:-} > "$out/ncu-$tag.csv" 2> "$out/ncu-$tag.err"
    python3 scripts/ncu-summary.py "$out/ncu-$tag.csv" auto |
        tee "$out/ncu-summary-$tag.txt"
fi
if want serve; then
    m=$(model_dir llama-3.2-1b)
    "$pg/peregrine" serve --model "$m" --load-format dummy --port 8123 > "$out/serve.log" 2>&1 &
    srv=$!
    for _ in $(seq 120); do curl -sf localhost:8123/health > /dev/null 2>&1 && break; sleep 1; done
    "$pg/peregrine" bench serve --port 8123 --num-requests 1000 --concurrency 64 --input-len 128 --output-len 128 \
        --token-id-range 1000:100000 --quiet > "$out/bench_serve.log" 2>&1
    kill $srv; wait $srv 2>/dev/null
    cat "$out/bench_serve.log" | tail -20
    table+=("serve 1b c64: $(grep -iE 'ttft|tpot|output' "$out/bench_serve.log" | tr -s ' ' | tr '\n' ';' | head -c 400)")
fi

echo "==== summary ($(head -1 "$out/gpu.txt"))"
for l in "${table[@]}"; do echo "  $l"; done
