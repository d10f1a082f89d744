#!/usr/bin/env python3
"""An FP8 checkpoint of a fixture model and its logits, made with torch and transformers (an
independent reference: never Peregrine). Run on the device machine, whose Python has torch,
transformers and safetensors:

    python3 scripts/make-fp8-fixture.py OUT_DIR [MODEL]   # MODEL: llama3-tiny (default), qwen3-tiny

OUT_DIR receives a Hugging Face folder: the fixture's config.json with a compressed-tensors
quantization_config (float-quantized, strategy channel, as llm-compressor's FP8_DYNAMIC scheme
writes it), model.safetensors with every layer matrix as F8_E4M3 (torch.float8_e4m3fn, one
factor per output row: amax / 448, stored as bf16 weight_scale [rows, 1]) and the other tensors
as they were, the tokenizer files, and logits.f32: transformers' float32 logits of the fixture's
golden prompt with each layer matrix replaced by its dequantized value (code * factor).

Then PG_FP8_FIXTURE_DIR=OUT_DIR build/peregrine_tests --gtest_filter='Fp8Checkpoint.*' compares
Peregrine's CPU logits of OUT_DIR with logits.f32 (Fp8Checkpoint.MatchesTransformersFixture)."""
import json, os, shutil, sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_layer_matrix(name):
    return ".layers." in name and name.endswith("_proj.weight")


def main():
    out = sys.argv[1]
    model = sys.argv[2] if len(sys.argv) > 2 else "llama3-tiny"
    src = os.path.join(ROOT, "tests", "data", model)
    os.makedirs(out, exist_ok=True)
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), out)

    tensors = load_file(os.path.join(src, "model.safetensors"))
    quantized, dequantized = {}, {}
    for name, w in tensors.items():
        if not is_layer_matrix(name):
            quantized[name] = w
            continue
        x = w.float()
        amax = x.abs().amax(dim=1, keepdim=True)
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax)).to(torch.bfloat16)
        codes = (x / scale.float()).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        quantized[name] = codes
        quantized[name + "_scale"] = scale
        dequantized[name] = codes.float() * scale.float()
    save_file(quantized, os.path.join(out, "model.safetensors"))

    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                            "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                      "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    # The reference: the bf16 model in float32 with the dequantized matrices swapped in.
    m = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32)
    state = m.state_dict()
    with torch.no_grad():
        for name, v in dequantized.items():
            state[name].copy_(v)
    with open(os.path.join(src, "golden.json")) as f:
        ids = json.load(f)["prompt_ids"]
    with torch.no_grad():
        logits = m(torch.tensor([ids])).logits[0].float().contiguous()
    logits.numpy().tofile(os.path.join(out, "logits.f32"))
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump({"prompt_ids": ids}, f)
    print(f"{out}: {len(dequantized)} FP8 matrices, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
