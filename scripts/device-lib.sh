# Helpers of the scripts/device-*.sh runs, sourced from the repo root on the GPU machine.

# model_dir SHAPE -> /tmp/models/SHAPE: bench/models/SHAPE/config.json and the Llama 3 tokenizer
# (from tests/data/tokenizers.tar.xz), for `--load-format dummy`.
model_dir() {
    local d=/tmp/models/$1
    if [[ ! -f $d/config.json ]]; then
        mkdir -p "$d" /tmp/tok
        cp "bench/models/$1/config.json" "$d/"
        [[ -d /tmp/tok/tokenizers/llama3 ]] || tar -C /tmp/tok -xJf tests/data/tokenizers.tar.xz tokenizers/llama3
        cp /tmp/tok/tokenizers/llama3/tokenizer*.json "$d/"
    fi
    echo "$d"
}

# bench_model SPEC: sets bench_args, the `--model ...` arguments of a `bench` run for SPEC: a GGUF
# path; SHAPE (a bench/models folder: random bf16 weights, `--load-format dummy`), SHAPE:fp8 (the
# same, `--quantization fp8`); or llama3.1-8b / llama3.2-1b:TYPE (q4_k_m, q8_0, ...): the random
# GGUF of scripts/make_random_gguf.py (Llama 3 vocabulary), written to /tmp/g once per machine.
bench_model() {
    local spec=$1
    if [[ $spec == *.gguf ]]; then
        bench_args=(--model "$spec")
    elif [[ $spec != *:* || $spec == *:fp8 ]]; then
        bench_args=(--model "$(model_dir "${spec%%:*}")" --load-format dummy)
        [[ $spec == *:fp8 ]] && bench_args+=(--quantization fp8)
    else
        local f=/tmp/g/${spec%%:*}-${spec##*:}.gguf
        if [[ ! -f $f ]]; then
            mkdir -p /tmp/g /tmp/tok
            [[ -d /tmp/tok/tokenizers/llama3 ]] || tar -C /tmp/tok -xJf tests/data/tokenizers.tar.xz tokenizers/llama3
            python3 scripts/make_random_gguf.py /tmp/tok/tokenizers/llama3/tokenizer.json "$f" --shape "${spec%%:*}" \
                --dtype "${spec##*:}" --reuse-random | tail -1 >&2
        fi
        bench_args=(--model "$f")
    fi
}

# wait_ready LOG -> the URL once LOG has `serve`'s or `router`'s ready line (lines relayed from
# data-parallel replicas skipped); nothing after 300 s.
wait_ready() {
    local u
    for _ in $(seq 600); do
        u=$(grep -v "^replica " "$1" | grep -oE "ready: (serving '[^']*' at|routing at) http://[0-9.:]+" |
            grep -oE 'http://[0-9.:]+' | tail -1)
        [[ -n $u ]] && { echo "$u"; return; }
        sleep 0.5
    done
}

# unpack_bundle BUNDLE_DIR NAME: the bundle of scripts/pack-device.sh unpacked into /tmp/NAME;
# sets pg (its binaries), logs ($OUT/NAME, else /tmp/NAME/NAME) and the library path.
unpack_bundle() {
    mkdir -p "/tmp/$2" && tar -C "/tmp/$2" -xJf "$1/bundle.tar.xz"
    pg=/tmp/$2/pg
    export LD_LIBRARY_PATH=$pg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
    logs=${OUT:-/tmp/$2}/$2
    mkdir -p "$logs"
}

# start_llamacpp_build SRC_TAR DIR: unpacks llama.cpp (a `git archive` tarball) into DIR and
# builds llama-bench and llama-batched-bench there with CUDA for sm_90, detached (setsid: the
# build outlives this call, so a later call on the same warm machine finds it), nice 19, all but
# two cores. DIR/rc holds its exit status once done; logs in DIR/cmake.log and DIR/build.log.
start_llamacpp_build() {
    local d=$2
    # The archive's files under llama.cpp/ (git archive --prefix=llama.cpp/) or at its top.
    local first
    first=$(tar -tJf "$1" 2>/dev/null | head -1)  # (status unread: pipefail and SIGPIPE)
    if [[ $first == llama.cpp/* ]]; then
        mkdir -p "$d" && tar -C "$d" -xJf "$1"
    else
        mkdir -p "$d/llama.cpp" && tar -C "$d/llama.cpp" -xJf "$1"
    fi
    cat > "$d/build.sh" <<EOS
cd $d/llama.cpp && nice -n 19 cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > $d/cmake.log 2>&1 &&
    nice -n 19 cmake --build build -j $(( $(nproc) - 2 )) --target llama-bench llama-batched-bench > $d/build.log 2>&1
echo \$? > $d/rc
EOS
    setsid nohup bash "$d/build.sh" > /dev/null 2>&1 < /dev/null &
}
