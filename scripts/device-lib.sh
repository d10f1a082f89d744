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
