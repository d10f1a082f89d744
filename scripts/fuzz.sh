#!/usr/bin/env bash
# Builds one libFuzzer target (clang, ASan + UBSan) and runs it on its committed seed corpus.
#   scripts/fuzz.sh TARGET [SECONDS] [libFuzzer options...]     e.g. scripts/fuzz.sh tokenizer 600
# TARGET is a fuzz/fuzz_TARGET.cc; new inputs go to $BUILD_DIR/corpus/TARGET (the seeds in
# fuzz/corpus/TARGET are only read); crashes land in $BUILD_DIR/artifacts/TARGET.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh TARGET [SECONDS] [libFuzzer options...]}
seconds=${2:-600}
shift $(( $# >= 2 ? 2 : 1 ))
build=${BUILD_DIR:-build-fuzz}
cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPEREGRINE_FUZZ=ON -DPEREGRINE_BUILD_TESTS=OFF -DPEREGRINE_CUDA=OFF >/dev/null
cmake --build "$build" --target "fuzz_$target"
mkdir -p "$build/corpus/$target" "$build/artifacts/$target"
exec "$build/fuzz/fuzz_$target" "$build/corpus/$target" "fuzz/corpus/$target" \
     -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
     -artifact_prefix="$build/artifacts/$target/" "$@"
