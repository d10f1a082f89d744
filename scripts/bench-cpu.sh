#!/usr/bin/env bash
# Side-by-side CPU benchmark: Peregrine's `generate` and llama.cpp's `llama-bench` on the same
# GGUF files, same thread count, one after the other, like llama-bench's pp128 / tg32.
#
#   scripts/bench-cpu.sh LLAMA_CPP_BUILD_DIR MODEL.gguf [MODEL.gguf ...]
#
# LLAMA_CPP_BUILD_DIR holds bin/llama-bench (build llama.cpp from source yourself; nothing of
# it belongs in this repository). Env: THREADS (2), REPS (3), PROMPT (128), GEN (32).
# Prints a markdown table: tokens/s, median of REPS for Peregrine, llama-bench's mean.
set -euo pipefail
peer=${1:?usage: $0 LLAMA_CPP_BUILD_DIR MODEL.gguf...}
shift
threads=${THREADS:-2}
reps=${REPS:-3}
prompt_len=${PROMPT:-128}
gen=${GEN:-32}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/build/peregrine
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 1; }
[ -x "$peer/bin/llama-bench" ] || { echo "no $peer/bin/llama-bench" >&2; exit 1; }

# Token ids inside every vocabulary we use (Llama 3 and Qwen2 have > 100k tokens).
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(1000, 30000)) for _ in range($prompt_len)))")

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "| model | engine | pp$prompt_len tokens/s | tg$gen tokens/s |"
echo "|---|---|---|---|"
for model in "$@"; do
    name=$(basename "$model" .gguf)
    pp=(); tg=()
    for _ in $(seq "$reps"); do
        line=$("$bin" generate --model "$model" --prompt-ids "$ids" --max-tokens $((gen + 1)) --temperature 0 \
                 --ignore-eos --threads "$threads" 2>&1 >/dev/null | grep '^prefill:')
        pp+=("$(sed -E 's/.*prefill: [0-9]+ tokens in [0-9.]+ ms \(([0-9.]+) tokens\/s\).*/\1/' <<<"$line")")
        tg+=("$(sed -E 's/.*decode: [0-9]+ tokens in [0-9.]+ ms \(([0-9.]+) tokens\/s\).*/\1/' <<<"$line")")
    done
    echo "| $name | peregrine | $(printf '%s\n' "${pp[@]}" | median) | $(printf '%s\n' "${tg[@]}" | median) |"
    "$peer/bin/llama-bench" -m "$model" -t "$threads" -p "$prompt_len" -n "$gen" -r "$reps" -o csv 2>/dev/null |
        python3 -c "
import csv, sys
rows = list(csv.DictReader(sys.stdin))
pp = [r for r in rows if r['n_prompt'] != '0' and r['n_gen'] == '0']
tg = [r for r in rows if r['n_gen'] != '0' and r['n_prompt'] == '0']
f = lambda r: '%.1f' % float(r[0]['avg_ts']) if r else '-'
print('| $name | llama.cpp (%s) | %s | %s |' % (rows[0].get('build_commit', '?'), f(pp), f(tg)))
"
done
