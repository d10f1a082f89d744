#!/usr/bin/env bash
# /v1/embeddings on the GPU (device tool, repo root) against the sentence-transformers goldens of
# tests/data/embeddings (issue #25): each case's folder is the fixture model plus the case's
# sentence-transformers files; `serve --task embed` on the CUDA backend embeds the golden token ids
# and the texts; prints the worst cosine and max |difference| per case.
# usage: scripts/device-embed.sh BUNDLE_DIR
set -uo pipefail
source scripts/device-lib.sh
unpack_bundle "$1" em
for case in qwen3-tiny-last llama3-tiny-mean qwen2-tiny-mean-raw; do
    model=$(python3 -c "import json,sys; print(json.load(open('tests/data/embeddings/$case.golden.json'))['model'])")
    d=/tmp/em/models/$case
    rm -rf "$d" && mkdir -p "$d" && cp tests/data/$model/{config.json,model.safetensors,tokenizer.json,tokenizer_config.json} "$d/"
    cp -r tests/data/embeddings/$case/. "$d/"
    "$pg/peregrine" serve --port 0 --model "$d" --device ${DEVICE:-cuda} --task embed > $logs/serve-$case.log 2>&1 & pid=$!
    url=$(wait_ready $logs/serve-$case.log)
    python3 - "$url" tests/data/embeddings/$case.golden.json "$case" <<'PY'
import json, math, sys, urllib.request
url, golden, case = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
def embed(inp):
    req = urllib.request.Request(url + "/v1/embeddings", json.dumps({"input": inp}).encode(),
                                 {"content-type": "application/json"})
    return [d["embedding"] for d in json.load(urllib.request.urlopen(req, timeout=60))["data"]]
def worst(got):
    cos, diff = 1.0, 0.0
    for a, b in zip(got, golden["embeddings"]):
        dot = sum(x * y for x, y in zip(a, b))
        cos = min(cos, dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b)))
        diff = max(diff, max(abs(x - y) for x, y in zip(a, b)))
    return cos, diff
for name, inp in (("ids", golden["token_ids"]), ("texts", golden["inputs"])):
    if name == "texts" and case.startswith("qwen2"):
        continue  # transformers' own Qwen2 tokenizer class differs from the file's (see tests)
    cos, diff = worst(embed(inp))
    print(f"{case} {name}: {len(inp)} inputs, worst cosine 1 - {1 - cos:.2e}, max |diff| {diff:.2e}")
PY
    kill $pid; wait $pid 2>/dev/null
done
