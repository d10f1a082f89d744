#!/usr/bin/env python3
"""Golden embeddings for the fixture models, from sentence-transformers (an independent
reference: never Peregrine). Run on the device machine, whose Python has torch, transformers and
sentence-transformers:  python3 scripts/make-embedding-goldens.py OUT_DIR

For each case it builds a sentence-transformers folder in a temp dir: the fixture model's HF files
plus modules.json, 1_Pooling/config.json (and 2_Normalize when normalising) copied from
tests/data/embeddings/<case>/, loads it with SentenceTransformer in float32 on the CPU, and writes
OUT_DIR/<case>.json: the inputs, the token ids the model's tokenizer gave, and the embeddings
(float32 values printed with 9 significant digits)."""
import json, os, shutil, sys, tempfile

import torch
from sentence_transformers import SentenceTransformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
CASES = {  # case -> fixture model folder
    "qwen3-tiny-last": "qwen3-tiny",
    "llama3-tiny-mean": "llama3-tiny",
    "qwen2-tiny-mean-raw": "qwen2-tiny",
}
INPUTS = [
    "Once upon a time",
    "The little dog ran to the park and played with a red ball all day.",
    "a",
    "Tom and Lily were friends. They liked to share their toys and sing songs under the big tree "
    "near the river, where the birds came to listen.",
    "Hello, world!",
    "She said: \"Look at the sky!\" and smiled.",
]


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    for case, model in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            folder = os.path.join(tmp, case)
            shutil.copytree(os.path.join(DATA, model), folder,
                            ignore=shutil.ignore_patterns("golden.json", "logits.f32"))
            shutil.copytree(os.path.join(DATA, "embeddings", case), folder, dirs_exist_ok=True)
            st = SentenceTransformer(folder, device="cpu", model_kwargs={"torch_dtype": torch.float32})
            st = st.float()
            # The stories vocabulary has no pad token (and qwen2's tokenizer class invents one past
            # the 512 rows): pad with EOS, which the attention mask hides anyway.
            st.tokenizer.pad_token = st.tokenizer.eos_token
            ids = [st.tokenizer(text)["input_ids"] for text in INPUTS]
            emb = st.encode(INPUTS, batch_size=len(INPUTS), convert_to_numpy=True,
                            normalize_embeddings=False).astype("float32")
            # One at a time too: padding must not change a row (a check of the reference itself).
            single = [st.encode([t], convert_to_numpy=True)[0] for t in INPUTS]
            drift = max(float(abs(a - b).max()) for a, b in zip(emb, single))
            with open(os.path.join(DATA, "embeddings", case, "modules.json")) as f:
                modules = json.load(f)
            doc = {
                "source": "sentence-transformers %s, torch %s, float32 on the CPU" % (
                    __import__("sentence_transformers").__version__, torch.__version__),
                "model": model,
                "modules": [m["type"] for m in modules],
                "padding_drift": drift,
                "inputs": INPUTS,
                "token_ids": ids,
                "embeddings": [[float("%.9g" % v) for v in row] for row in emb.tolist()],
            }
            with open(os.path.join(out_dir, case + ".json"), "w") as f:
                json.dump(doc, f, indent=1)
            print(case, emb.shape, "drift", drift, "norms", [round(float((r * r).sum()) ** 0.5, 6) for r in emb])


if __name__ == "__main__":
    main(sys.argv[1])
