#!/usr/bin/env bash
# CI: builds the libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined) in build-fuzz and
# runs each over its seed corpus in fuzz/corpus/<name> for a bounded time. Any crash, sanitizer
# report, leak, timeout or out-of-memory fails the run; the reproducer is left in ARTIFACTS.
# New inputs go to a temporary copy of the corpus, so the git tree stays clean.
#
# The targets run side by side (one core each, at most JOBS at once).
#
# Environment: BUILD_DIR (default build-fuzz), FUZZ_TIME (seconds per target, default 60),
# FUZZ_TARGETS (default "chat_template tokenizer grammar"), ARTIFACTS (default BUILD_DIR/fuzz-artifacts),
# KEEP_CORPUS=DIR (copy each grown corpus to DIR/<name> afterwards, e.g. to merge new seeds).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
BUILD_DIR="${BUILD_DIR:-build-fuzz}"
FUZZ_TIME="${FUZZ_TIME:-60}"
FUZZ_TARGETS="${FUZZ_TARGETS:-chat_template tokenizer grammar}"
ARTIFACTS="${ARTIFACTS:-$root/$BUILD_DIR/fuzz-artifacts}"
JOBS="${JOBS:-$(nproc)}"

scripts/install-deps.sh

start=$SECONDS
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DPEREGRINE_FUZZ=ON -DPEREGRINE_BUILD_TESTS=OFF -DPEREGRINE_CUDA=OFF >/dev/null
targets=()
for t in $FUZZ_TARGETS; do targets+=("fuzz_$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"
echo "ci-fuzz: build took $((SECONDS - start)) s"

symbolizer="$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)"
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH="$symbolizer"
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:print_summary=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$ARTIFACTS"

# One target: libFuzzer's output to $work/<name>.log, its exit status to $work/<name>.rc.
fuzz_one() {
    local t="$1" rc=0
    local args=(-max_total_time="$FUZZ_TIME" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$ARTIFACTS/$t-")
    [ -f "fuzz/$t.dict" ] && args+=(-dict="$root/fuzz/$t.dict")
    # The first corpus dir is the writable one: a copy of the seeds.
    "$root/$BUILD_DIR/fuzz/fuzz_$t" "${args[@]}" "$work/$t" >"$work/$t.log" 2>&1 || rc=$?
    echo "$rc" >"$work/$t.rc"
}

# The targets run side by side, at most JOBS at once (each is one process, one core).
start=$SECONDS
running=0
for t in $FUZZ_TARGETS; do
    mkdir -p "$work/$t"
    cp -r "$root/fuzz/corpus/$t/." "$work/$t/"
    echo "ci-fuzz: fuzz_$t for ${FUZZ_TIME} s over $(find "$work/$t" -type f | wc -l) seeds"
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    fuzz_one "$t" &
    running=$((running + 1))
done
wait
echo "ci-fuzz: fuzzing took $((SECONDS - start)) s"

status=0
for t in $FUZZ_TARGETS; do
    rc="$(cat "$work/$t.rc")"
    echo "----- fuzz_$t"
    # libFuzzer prints a status line (cov:, ft:, corp:, exec/s) at each power of two of
    # executions (pulse) and at each new input (NEW, REDUCE: one in 50 shown here).
    grep -E '^#[0-9]+[[:space:]]+(INITED|pulse|DONE|NEW|REDUCE)' "$work/$t.log" |
        awk '/INITED|DONE|pulse/ || NR % 50 == 0' || true
    grep -E '^(stat::|Done [0-9]+ runs)' "$work/$t.log" || true
    echo "ci-fuzz: fuzz_$t exit $rc, corpus $(find "$work/$t" -type f | wc -l) files"
    if [ "$rc" -ne 0 ]; then
        echo "ci-fuzz: fuzz_$t FAILED; its log:" >&2
        grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE)' "$work/$t.log" | tail -n 150 >&2
        ls -l "$ARTIFACTS" >&2
        status=1
    fi
    if [ -n "${KEEP_CORPUS:-}" ]; then
        mkdir -p "$KEEP_CORPUS/$t"
        cp -r "$work/$t/." "$KEEP_CORPUS/$t/"
    fi
done
[ "$status" -eq 0 ] && echo "ci-fuzz: no crashes"
exit "$status"
