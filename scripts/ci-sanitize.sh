#!/usr/bin/env bash
# CI: the test suite under AddressSanitizer + UndefinedBehaviorSanitizer (g++).
#
# Builds build-asan (RelWithDebInfo, -DPEREGRINE_SANITIZE=ON, no CUDA) with only the targets the
# tests need (peregrine, peregrine_tests: no bench_* targets), then runs ctest there: the unit,
# engine, golden and CLI tests and the node server tests, which spawn the sanitized `peregrine`.
# Every sanitizer report, including those of server processes whose stderr a test does not show,
# is also written under BUILD_DIR/sanitizer-logs/; any report there fails the run and is printed.
#
# Environment: BUILD_DIR (default build-asan), JOBS (default nproc), CTEST_ARGS (extra ctest
# arguments, e.g. "-R server_" or "-E golden").
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
start=$SECONDS
status=0
# The two schema-corpus random walks over the 128K-token Llama 3 vocabulary are left to the
# Release run: under the sanitizers they took 295 s and 161 s of the 1,295 s ctest (session 18);
# their small-vocabulary twins, GrammarTokenMask.ExactOnLlama3Vocabulary and fuzz_grammar keep the
# grammar code under ASan + UBSan.
# shellcheck disable=SC2086
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" --timeout 1200 \
    -E '^GrammarSchemaCorpus\.RandomWalks(EndWithinTheBudget)?OnLlama3Vocabulary$' ${CTEST_ARGS:-}) || status=$?
echo "ci-sanitize: ctest took $((SECONDS - start)) s"

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
