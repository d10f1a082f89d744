#!/usr/bin/env bash
# Tokenizer throughput on one core: Peregrine vs Hugging Face's Rust tokenizer (npm `tokenizers`)
# encoding war-and-peace.txt with the Llama 3 tokenizer.json from tests/data/tokenizers.tar.xz.
#   bench/tokenizer.sh [BUILD_DIR] [CORE]        (BUILD_DIR default: build; CORE default: 1)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
core=${2:-1}
data=$build/test-data/tokenizers
[ -f "$data/war-and-peace.txt" ] || cmake --build "$build" --target tokenizer_test_data
for tok in llama3/tokenizer.json qwen3/tokenizer.json ggml-vocab-llama-spm.gguf; do
    echo "== $tok"
    for mode in "" --per-line; do
        taskset -c "$core" "$build/peregrine" tokenize --raw --bench 5 $mode --tokenizer "$data/$tok" - < "$data/war-and-peace.txt"
    done
    case $tok in
        *.json)
            peer=${PEER_DIR:-/tmp/peregrine-tokenizers-peer}
            if [ ! -d "$peer/node_modules/tokenizers" ]; then
                mkdir -p "$peer" && (cd "$peer" && npm install --silent --no-save tokenizers >/dev/null)
            fi
            for mode in "" --per-line; do
                TOKENIZERS_PARALLELISM=false NODE_PATH="$peer/node_modules" \
                    taskset -c "$core" node bench/tokenizer_peer.js "$data/$tok" "$data/war-and-peace.txt" 5 $mode
            done
            ;;
    esac
done
