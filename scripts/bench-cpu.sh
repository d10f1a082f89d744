#!/usr/bin/env bash
# Side-by-side CPU benchmark: Peregrine's `generate` and llama.cpp's `llama-bench` on the same
# GGUF files, same thread count, one after the other, like llama-bench's pp128 / tg32.
#
#   scripts/bench-cpu.sh LLAMA_CPP_BUILD_DIR MODEL.gguf [MODEL.gguf ...]
#
# LLAMA_CPP_BUILD_DIR holds bin/llama-bench (build llama.cpp from source yourself; nothing of
# it belongs in this repository). Env: THREADS (2), REPS (5), PROMPT (128), GEN (32),
# BIN (build/peregrine).
#
# Prints a markdown table. Each engine runs REPS times, the two alternating run by run; the table
# gives the best run (tokens/s) and, after the slash, the worst, so a noisy (shared) machine
# shows. Decode is also given as weight bytes read per second (the GGUF's tensor data, read
# once per token) and as a fraction of the machine's read bandwidth, measured first by a
# plain THREADS-thread read of a 1 GiB buffer (best of 5), over 4 KiB and 2 MiB pages (the
# larger is the reference).
set -euo pipefail
peer=${1:?usage: $0 LLAMA_CPP_BUILD_DIR MODEL.gguf...}
shift
threads=${THREADS:-2}
reps=${REPS:-5}
prompt_len=${PROMPT:-128}
gen=${GEN:-32}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/peregrine}
[ -x "$bin" ] || { echo "build first: make build (or set BIN)" >&2; exit 1; }
[ -x "$peer/bin/llama-bench" ] || { echo "no $peer/bin/llama-bench" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Read bandwidth: each thread sums its share of a 1 GiB buffer with 256-bit loads.
cat >"$work/bw.c" <<'EOF'
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#define SZ (1ull << 30)
static uint8_t* buf;
static int nt;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void* worker(void* arg) {
    const long id = (long)arg;
    const __m256i* p = (const __m256i*)(buf + id * (SZ / nt));
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    for (size_t i = 0; i < SZ / nt / 32; i += 2) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(p + i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + i + 1));
    }
    static volatile long long sink;
    sink = _mm256_extract_epi64(_mm256_add_epi64(a0, a1), 0);
    return NULL;
}
int main(int argc, char** argv) {
    nt = atoi(argv[1]);
    buf = aligned_alloc(2 << 20, SZ);
    if (argv[2][0] == 'h') madvise(buf, SZ, MADV_HUGEPAGE);
    memset(buf, 1, SZ);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        pthread_t th[64];
        const double t0 = now();
        for (long i = 0; i < nt; i++) pthread_create(&th[i], NULL, worker, (void*)i);
        for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
        const double gbs = SZ / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("%.1f\n", best);
    return 0;
}
EOF
cc -O2 -mavx2 -pthread "$work/bw.c" -o "$work/bw"
bw4k=$("$work/bw" "$threads" 4k)
bw2m=$("$work/bw" "$threads" huge)
bw=$(python3 -c "print(max($bw4k, $bw2m))")
echo "read bandwidth, $threads threads, 1 GiB buffer: $bw4k GB/s over 4 KiB pages, $bw2m GB/s over 2 MiB pages"
echo "(decode fractions below are of the larger: both engines map the GGUF, and the kernel maps page-cache"
echo "folios of 2 MiB with PMDs; check FilePmdMapped in /proc/PID/smaps_rollup)"
echo

# Token ids inside every vocabulary we use (Llama 3 and Qwen2 have > 100k tokens).
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(1000, 30000)) for _ in range($prompt_len)))")

# Bytes of tensor data in a GGUF file (what one decode step reads, the embedding row aside).
weight_bytes() {
    python3 - "$1" <<'EOF'
import struct, sys
f = open(sys.argv[1], "rb")
magic, version, n_tensors, n_kv = struct.unpack("<IIQQ", f.read(24))
def rstr():
    (n,) = struct.unpack("<Q", f.read(8)); return f.read(n)
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t):
    if t == 8: rstr()
    elif t == 9:
        et, n = struct.unpack("<IQ", f.read(12))
        for _ in range(n): skip(et)
    else: f.read(SIZES[t])
for _ in range(n_kv):
    rstr(); (t,) = struct.unpack("<I", f.read(4)); skip(t)
# type: (block elements, block bytes) for the types we meet
T = {0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210), 10: (256, 84), 11: (256, 110)}
total = 0
for _ in range(n_tensors):
    rstr(); (nd,) = struct.unpack("<I", f.read(4)); dims = struct.unpack("<%dQ" % nd, f.read(8 * nd))
    t, off = struct.unpack("<IQ", f.read(12)); n = 1
    for d in dims: n *= d
    be, bb = T[t]; total += n // be * bb
print(total)
EOF
}

minmax() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.1f / %.1f", hi, lo}'; }

echo "| model | engine | pp$prompt_len tokens/s (best / worst) | tg$gen tokens/s (best / worst) | decode GB/s (best) | of bandwidth |"
echo "|---|---|---|---|---|---|"
for model in "$@"; do
    name=$(basename "$model" .gguf)
    bytes=$(weight_bytes "$model")
    pp=(); tg=(); lpp=(); ltg=()
    for _ in $(seq "$reps"); do
        line=$("$bin" generate --model "$model" --prompt-ids "$ids" --max-tokens $((gen + 1)) --temperature 0 \
                 --ignore-eos --threads "$threads" 2>&1 >/dev/null | grep '^prefill:')
        pp+=("$(sed -E 's/.*prefill: [0-9]+ tokens in [0-9.]+ ms \(([0-9.]+) tokens\/s\).*/\1/' <<<"$line")")
        tg+=("$(sed -E 's/.*decode: [0-9]+ tokens in [0-9.]+ ms \(([0-9.]+) tokens\/s\).*/\1/' <<<"$line")")
        # One llama-bench repetition per round, so both engines see the same machine load.
        read -r a b commit < <("$peer/bin/llama-bench" -m "$model" -t "$threads" -p "$prompt_len" -n "$gen" -r 1 -o json 2>/dev/null |
            python3 -c "
import json, sys
rows = json.load(sys.stdin)
pp = [r['avg_ts'] for r in rows if r['n_prompt'] > 0 and r['n_gen'] == 0]
tg = [r['avg_ts'] for r in rows if r['n_gen'] > 0 and r['n_prompt'] == 0]
print(pp[0], tg[0], rows[0].get('build_commit', '?'))
")
        lpp+=("$a"); ltg+=("$b")
    done
    for engine in peregrine "llama.cpp ($commit)"; do
        if [ "$engine" = peregrine ]; then p=("${pp[@]}"); t=("${tg[@]}"); else p=("${lpp[@]}"); t=("${ltg[@]}"); fi
        best_tg=$(printf '%s\n' "${t[@]}" | sort -g | tail -1)
        gbs=$(python3 -c "print('%.1f' % ($bytes * $best_tg / 1e9))")
        frac=$(python3 -c "print('%.0f%%' % (100 * $bytes * $best_tg / 1e9 / $bw))")
        echo "| $name | $engine | $(printf '%s\n' "${p[@]}" | minmax) | $(printf '%s\n' "${t[@]}" | minmax) | $gbs | $frac |"
    done
done
