#!/usr/bin/env python3
"""What E4M3 does to a model, by transformers and torch alone: an independent check of Peregrine's
`--kv-cache-dtype fp8` and `--quantization fp8` figures.

KV cache: the model's eager attention is wrapped so that
every key and value (after RoPE, as a cache holds them) is replaced by its E4M3 round trip with
one bf16 scale per (token, kv head): scale = bf16(amax / 448), code = e4m3(x / scale) (round to
nearest even, torch.float8_e4m3fn), value = code * scale. That is the format of core/kv_fp8.h.
Also keys only and values only.

Weights (--quantization fp8): every layer matrix (q, k, v, o, gate, up, down; not the embedding
or head) becomes its E4M3 round trip with one f32 factor per output row (amax / 448), as
Peregrine quantizes at load; "weights and inputs" also rounds each product's input to E4M3 with
one factor per token (amax / 448), the W8A8 products of prefill (more than 4 rows).

Logits of every position with and without it are compared: argmax agreement and mean KL.

    python3 scripts/fp8-reference.py [MODEL_DIR] [HELDOUT_JSON]

Defaults: tests/data/text-trained and its heldout.json (8 passages of BOS + 255 tokens). Runs on
the CPU in float32 (the weights upcast)."""
import json, os, sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.models.llama import modeling_llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def e4m3_rows(x, bf16_scale=False):
    """x [..., d]: the E4M3 round trip with one factor per row, amax / 448 (bf16_scale: rounded
    to bf16, as core/kv_fp8.h's cache scales; else f32, as the FP8 weights and activations)."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    f = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    if bf16_scale:
        f = f.to(torch.bfloat16).float()
    return (x / f).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * f


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "text-trained")
    held = sys.argv[2] if len(sys.argv) > 2 else os.path.join(model_dir, "heldout.json")
    seqs = json.load(open(held))["sequences"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    eager = modeling_llama.eager_attention_forward
    mode = {"k": False, "v": False}

    def patched(module, query, key, value, *args, **kwargs):  # key / value: [batch, kv heads, seq, d]
        if mode["k"]:
            key = e4m3_rows(key, bf16_scale=True)
        if mode["v"]:
            value = e4m3_rows(value, bf16_scale=True)
        return eager(module, query, key, value, *args, **kwargs)

    modeling_llama.eager_attention_forward = patched

    def logits(k, v):
        mode["k"], mode["v"] = k, v
        with torch.no_grad():
            return torch.cat([model(input_ids=torch.tensor([s])).logits[0] for s in seqs])

    def report(name, ref, got):
        agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
        kl = F.kl_div(got.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="batchmean").item()
        print(f"e4m3 {name}: {ref.shape[0]} positions, argmax agreement {agree:.4f}, mean KL {kl:.3g}, "
              f"max |dlogit| {(ref - got).abs().max().item():.3g}", flush=True)

    ref = logits(False, False)
    for name, k, v in (("keys and values", True, True), ("keys only", True, False), ("values only", False, True)):
        report("cache, " + name, ref, logits(k, v))

    linears = [m for n, m in model.named_modules() if ".layers." in n and isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for m in linears:
            m.weight.copy_(e4m3_rows(m.weight))
    report("weights", ref, logits(False, False))
    hooks = [m.register_forward_pre_hook(lambda mod, args: (e4m3_rows(args[0]),)) for m in linears]
    report("weights and inputs", ref, logits(False, False))
    for h in hooks:
        h.remove()


if __name__ == "__main__":
    main()
