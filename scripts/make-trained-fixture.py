#!/usr/bin/env python3
"""The trained fixture: a small Llama with 64-wide heads trained on English text, and its golden
logits from transformers (an independent reference: never Peregrine). The other fixtures are
random weights (near-tied top logits: a quantizer's argmax agreement there measures ties, not
error) with heads 8-32 wide; this one predicts text, with the head width of real models.

Run on the device machine (torch, transformers, a GPU):

    python3 scripts/make-trained-fixture.py TRAIN.txt.xz HELDOUT.txt.xz OUT_DIR [SECONDS]

TRAIN / HELDOUT: xz-compressed UTF-8 text. The committed fixture (tests/data/text-trained) was
trained on the reStructuredText sources of Python 3.11's documentation (Debian's python3.11-doc,
`html/_sources/**/*.rst.txt`, PSF license) without the tutorial, which is held out: the golden
prompt comes from it. Tokens: the embedded model's 512-entry tokenizer (models/stories260K),
each line encoded alone, lines joined by the newline's byte token.

OUT_DIR receives a Hugging Face folder: config.json, model.safetensors (bfloat16), the
tokenizer files, golden.json (prompt_ids: BOS + 255 held-out tokens; greedy_ids: 32 argmax
tokens after it; produced_by) and logits.f32 (float32 [256, 512]: transformers' eager float32
forward of the bfloat16 weights, on the CPU), and train-log.json (steps, tokens, held-out loss,
the top-two margins of the golden positions)."""
import json, lzma, math, os, shutil, sys, time

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKDIR = os.path.join(ROOT, "models", "stories260K")
BOS, EOS = 1, 2
SEQ, BATCH = 256, 128
PEAK_LR = 3e-3


def encode(tok, path):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    nl = tok.encode("\n", add_special_tokens=False)[-1:]  # the newline's byte token
    ids = []
    for enc in tok(lines, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.extend(nl)
    return ids


def main():
    train_path, held_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 150.0
    torch.manual_seed(0)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(TOKDIR, "tokenizer.json"))
    t0 = time.time()
    train_ids = torch.tensor(encode(tok, train_path), dtype=torch.int64)
    held_ids = torch.tensor(encode(tok, held_path), dtype=torch.int64)
    print(f"tokens: train {train_ids.numel()}, held out {held_ids.numel()} ({time.time() - t0:.1f} s)", flush=True)

    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=BOS,
                      eos_token_id=EOS, hidden_act="silu")
    dev = "cuda"
    model = LlamaForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.95), weight_decay=0.1)
    data = train_ids.to(dev)
    gen = torch.Generator(device=dev).manual_seed(0)

    def batch():
        off = torch.randint(0, data.numel() - SEQ, (BATCH,), device=dev, generator=gen)
        x = data[off[:, None] + torch.arange(SEQ, device=dev)[None, :]]
        x[:, 0] = BOS  # every sequence starts as a prompt does
        return x

    # Warm-up of 200 steps, then cosine decay to a tenth over the time budget (steps estimated
    # from the first 100).
    step, warm, total, start = 0, 200, None, time.time()
    while True:
        if step == 100:
            total = int(100 * seconds / (time.time() - start))
        if total is not None and step >= total:
            break
        if step < warm:
            lr = PEAK_LR * (step + 1) / warm
        else:
            frac = min(1.0, (step - warm) / max(1, (total or 10**9) - warm))
            lr = PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 500 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} ({time.time() - start:.0f} s)", flush=True)
        step += 1
    trained_s = time.time() - start

    os.makedirs(out, exist_ok=True)
    model = model.to(torch.bfloat16).cpu()
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(TOKDIR, f), out)

    # The reference: the saved bfloat16 weights upcast to float32, eager attention, CPU.
    ref = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        n = min(held_ids.numel() - 1, 64 * SEQ)
        nll, count = 0.0, 0
        for i in range(0, n - SEQ, SEQ):
            x = held_ids[i:i + SEQ].clone()[None]
            x[0, 0] = BOS
            lg = ref(input_ids=x).logits[0, :-1]
            nll += F.cross_entropy(lg, x[0, 1:], reduction="sum").item()
            count += SEQ - 1
        prompt = [BOS] + held_ids[1000:1255].tolist()
        logits = ref(input_ids=torch.tensor([prompt])).logits[0].float()
        seq, greedy = list(prompt), []
        for _ in range(32):
            nxt = int(ref(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            greedy.append(nxt)
            seq.append(nxt)
    top2 = logits.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits.f32"))
    produced = f"transformers {transformers.__version__}, torch {torch.__version__}"
    golden = {"prompt_ids": prompt, "greedy_ids": greedy, "logits_shape": list(logits.shape),
              "logits_file": "logits.f32", "dtype_of_compute": "float32", "attn_implementation": "eager",
              "produced_by": produced}
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f)
    log = {"steps": step, "train_seconds": round(trained_s, 1), "tokens_seen": step * BATCH * SEQ,
           "train_tokens": train_ids.numel(), "heldout_tokens_scored": count,
           "heldout_loss_nats": round(nll / count, 4), "gpu": torch.cuda.get_device_name(0),
           "golden_margin_quantiles": [round(float(margin.quantile(q)), 4) for q in (0.01, 0.05, 0.1, 0.5)],
           "golden_positions_margin_below_0.05": int((margin < 0.05).sum()), "produced_by": produced}
    with open(os.path.join(out, "train-log.json"), "w") as f:
        json.dump(log, f, indent=1)
    print(json.dumps(log), flush=True)


if __name__ == "__main__":
    main()
