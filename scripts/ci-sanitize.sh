#!/usr/bin/env bash
# CI: the test suite under AddressSanitizer + UndefinedBehaviorSanitizer (g++).
#
# Builds build-asan (RelWithDebInfo, -DPEREGRINE_SANITIZE=ON, no CUDA) with only the targets the
# tests need (peregrine, peregrine_tests: no bench_* targets), then runs the gtest cases (unit,
# engine, golden) in a few sharded processes and ctest for the rest: the CLI tests and the node
# server tests, which spawn the sanitized `peregrine`.
# Every sanitizer report, including those of server processes whose stderr a test does not show,
# is also written under BUILD_DIR/sanitizer-logs/; any report there fails the run and is printed.
#
# Environment: BUILD_DIR (default build-asan), JOBS (default nproc), SHARDS (gtest processes,
# default 4 x JOBS), CTEST_ARGS (extra arguments of the ctest run of the non-gtest entries, e.g.
# "-R server_").
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
BUILD_DIR="${BUILD_DIR:-build-asan}"
JOBS="${JOBS:-$(nproc)}"

scripts/install-deps.sh

# RelWithDebInfo at -O1 -g1 (line tables: stacks keep file:line) rather than -O2 -g: ASan's
# recommended level, and half the compile time of the sanitized build (the slow CI stage).
SANITIZE_FLAGS="${SANITIZE_FLAGS:--O1 -g1 -DNDEBUG}"
start=$SECONDS
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="$SANITIZE_FLAGS" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$SANITIZE_FLAGS" \
    -DPEREGRINE_SANITIZE=ON -DPEREGRINE_CUDA=OFF -DPEREGRINE_BUILD_TESTS=ON >/dev/null
logs="$root/$BUILD_DIR/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"

# gtest_discover_tests runs peregrine_tests at build time: the same options apply there.
# halt_on_error: the first report ends the process with a non-zero exit, so the test fails;
# detect_leaks: LeakSanitizer at exit. log_path: ASan and LeakSanitizer reports go to files
# $logs/san.PID, also those of the server processes the node tests start (stderr piped to
# node) and those at a server's exit after SIGTERM, which no test reads. It is a common flag:
# the UBSAN_OPTIONS value wins (parsed last), so both name it. (g++'s UBSan still prints its
# own reports to stderr; they fail the test through halt_on_error.)
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:print_summary=1:log_path=$logs/san"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/san"

cmake --build "$BUILD_DIR" -j "$JOBS" --target peregrine peregrine_tests
echo "ci-sanitize: build took $((SECONDS - start)) s"

# Sanitized code runs several times slower: give timeouts room (the server tests' own limit,
# 180 s or 540 s in a sanitized build, is set in CMakeLists.txt).
#
# The gtest cases (ctest label gtest, ~915 of the ~950 entries) run in SHARDS processes (default
# 4 x JOBS, JOBS at a time, gtest's own sharding), not ctest's process a case: a sanitized
# process takes ~1.4 s to start here (shadow memory, the suites' registration data), which was
# ~1,300 s of the ~1,900 s the cases took one process each (session 19). The rest (server, CLI,
# deploy, AVX2 golden runs) go through ctest as in the Release run.
# The two schema-corpus random walks over the 128K-token Llama 3 vocabulary are left to the
# Release run: under the sanitizers they took 295 s and 161 s (session 18); their small-vocabulary
# twins, GrammarTokenMask.ExactOnLlama3Vocabulary and fuzz_grammar keep the grammar code under
# ASan + UBSan.
start=$SECONDS
status=0
shards=${SHARDS:-$((4 * JOBS))}
shard_logs="$root/$BUILD_DIR/gtest-shards"
rm -rf "$shard_logs"
mkdir -p "$shard_logs"
export PG_GTEST_FILTER='-GrammarSchemaCorpus.RandomWalksOnLlama3Vocabulary:GrammarSchemaCorpus.RandomWalksEndWithinTheBudgetOnLlama3Vocabulary'
export PG_SHARDS=$shards PG_SHARD_LOGS=$shard_logs
# shellcheck disable=SC2016
seq 0 $((shards - 1)) | (cd "$BUILD_DIR" && xargs -P "$JOBS" -I{} sh -c '
    GTEST_TOTAL_SHARDS=$PG_SHARDS GTEST_SHARD_INDEX={} timeout 1800 ./peregrine_tests --gtest_brief=1 \
        "--gtest_filter=$PG_GTEST_FILTER" > "$PG_SHARD_LOGS/shard{}.log" 2>&1
    echo $? > "$PG_SHARD_LOGS/shard{}.rc"')
ran=0 failed_shards=0
for ((i = 0; i < shards; ++i)); do
    log="$shard_logs/shard$i.log"
    rc=$(cat "$shard_logs/shard$i.rc" 2>/dev/null || echo missing)
    n=$(grep -oE '^\[==========\] [0-9]+ tests? from' "$log" | grep -oE '[0-9]+' | head -1)
    ran=$((ran + ${n:-0}))
    if [ "$rc" != 0 ]; then
        failed_shards=$((failed_shards + 1))
        echo "ci-sanitize: gtest shard $i of $shards failed (exit $rc); its log:" >&2
        tail -n 80 "$log" >&2
    fi
done
echo "ci-sanitize: $ran gtest cases in $shards processes, $failed_shards failed shard(s), $((SECONDS - start)) s"
[ "$failed_shards" -eq 0 ] || status=1

# shellcheck disable=SC2086
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" --timeout 1200 -LE gtest ${CTEST_ARGS:-}) || status=$?
echo "ci-sanitize: tests took $((SECONDS - start)) s"

reports=("$logs"/*)
if [ -e "${reports[0]}" ]; then
    echo "ci-sanitize: ${#reports[@]} sanitizer report(s):" >&2
    for r in "${reports[@]}"; do
        echo "===== $r" >&2
        cat "$r" >&2
    done
    status=1
fi
if [ "$status" -ne 0 ]; then
    echo "ci-sanitize: FAILED" >&2
    exit "$status"
fi
echo "ci-sanitize: no sanitizer reports"
