#!/usr/bin/env bash
# FP8 weights (issue #23, `--quantization fp8`) on a GPU (device tool, repo root, a bundle of
# scripts/pack-device.sh in BUNDLE_DIR), one line per result:
#   tests   the FP8 product and quantizer tests, then memcheck of the FP8 kernel tests
#           (GPU_FILTER and MEMCHECK_FILTER override)
#   report  CudaGemvPerf.Report's lines (decode products on the 1B / 8B shapes, bf16 and FP8)
#   decode  8B and 1B batch-1 decode (128 in / 128 out, best of 3), bf16 then FP8, ROUNDS rounds
#           (default 2) alternating
#   batched 8B offline 256 x (128 in, 128 out) and prefill 64 x 512 (8192-token steps), bf16
#           vs FP8, ROUNDS rounds alternating
# usage: scripts/device-fp8w.sh BUNDLE_DIR [STEPS]   (default "tests report decode batched")
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle "$1" fp8w
steps=${2:-"tests report decode batched"}
export PG_TEST_DATA_DIR=$PWD/tests/data PG_MODELS_DIR=$PWD/models PEREGRINE_MODELS=$PWD/models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
t_start=$(date +%s)
stamp() { echo "[$(($(date +%s) - t_start)) s] $*"; }

if [[ $steps == *tests* ]]; then
    filter=${GPU_FILTER:-'CudaFp8.*:CudaGemv.*:CudaFp8Checkpoint.*'}
    timeout 300 "$pg/peregrine_cuda_tests" --gtest_filter="$filter" > "$logs/tests.log" 2>&1
    stamp "tests: rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$logs/tests.log" | tr '\n' ' ')"
    grep -E "^gpu |agreement|FAILED|Failure|Expected|Which is" "$logs/tests.log" | head -30
    mfilter=${MEMCHECK_FILTER:-'CudaFp8.FusedQuantizers*:CudaFp8.BackendProducts*:CudaGemv.Fp8*'}
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$pg/peregrine_cuda_tests" \
        --gtest_filter="$mfilter" > "$logs/memcheck.log" 2>&1
    stamp "memcheck: rc $? $(grep -m1 -o 'ERROR SUMMARY: [0-9]* errors' "$logs/memcheck.log")"
fi

if [[ $steps == *report* ]]; then
    timeout 300 "$pg/peregrine_cuda_tests" --gtest_filter='CudaGemvPerf.Report' > "$logs/report.log" 2>&1
    stamp "report: rc $?"
    grep -E "^gemv (fp8|bf16)" "$logs/report.log"
fi

bench() {  # name, then peregrine bench arguments
    local name=$1 f="$logs/$1.log"
    shift
    timeout 300 "$pg/peregrine" bench "$@" --load-format dummy > "$f" 2>&1
    stamp "$name: rc $? $(grep -E '^(throughput|latency) \(best' "$f" | tail -1)"
}
if [[ $steps == *decode* ]]; then
    for round in $(seq "${ROUNDS:-2}"); do
        for shape in llama-3.1-8b llama-3.2-1b; do
            m=$(model_dir $shape)
            args=(latency --model "$m" --batch-size 1 --input-len 128 --output-len 128)
            bench "decode-$shape-bf16-r$round" "${args[@]}"
            bench "decode-$shape-fp8-r$round" "${args[@]}" --quantization fp8
        done
    done
fi
if [[ $steps == *batched* ]]; then
    m=$(model_dir llama-3.1-8b)
    for round in $(seq "${ROUNDS:-2}"); do
        for q in none fp8; do
            bench "offline-8b-$q-r$round" throughput --model "$m" --num-prompts 256 --input-len 128 --output-len 128 \
                --iters 2 --quantization $q
            bench "prefill-8b-$q-r$round" throughput --model "$m" --num-prompts 64 --input-len 512 --output-len 1 \
                --max-num-batched-tokens 8192 --quantization $q
        done
    done
fi
stamp done
