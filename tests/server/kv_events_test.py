#!/usr/bin/python3
"""KV-cache events of `peregrine serve` read by independent code: Debian's python3-zmq (a real
ZMQ SUB socket and a DEALER for replay) and python3-msgpack, as llm-d's indexer or vLLM's own
subscriber would. Checks that every full prompt block a request commits arrives as BlockStored
with its tokens and a parent chain, that evictions arrive as BlockRemoved of stored blocks,
that sequence numbers have no gaps, that replay returns what the subscriber saw, and that the
vllm: gauges of /metrics equal the peregrine: ones while a request runs and after.

usage: kv_events_test.py PEREGRINE_BINARY"""
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import msgpack
import zmq

BLOCK = 16
TOPIC = b"kv@test-pod@stories260K"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        m = re.match(r"^((?:vllm|peregrine):[a-z_]+)\{[^}]*\} (\S+)$", line)
        if m:
            values[m.group(1)] = float(m.group(2))
    return values, text


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    binary = sys.argv[1]
    pub_port, replay_port = free_port(), free_port()
    # 24 blocks of 16 tokens (stories260K: 20,480 bytes a block in f32): small enough to evict.
    server = subprocess.Popen(
        [binary, "serve", "--port", "0", "--device", "cpu", "--threads", "1", "--kv-cache-memory", str(24 * 20480),
         "--kv-events-endpoint", f"tcp://127.0.0.1:{pub_port}", "--kv-events-topic", TOPIC.decode(),
         "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay_port}"],
        stderr=subprocess.PIPE, text=True)
    try:
        base = None
        log = []
        for line in server.stderr:
            log.append(line)
            m = re.search(r"ready: serving '[^']*' at (http://\S+)/v1", line)
            if m:
                base = m.group(1)
                break
        check(base, "server not ready:\n" + "".join(log))
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()

        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{pub_port}")
        sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
        time.sleep(0.5)  # the subscription reaches the publisher before the first event

        received = []  # (seq, payload bytes, decoded)

        def drain(wait_s):
            end = time.time() + wait_s
            while time.time() < end:
                if sub.poll(50):
                    topic, seq, payload = sub.recv_multipart()
                    check(topic == TOPIC, f"topic {topic!r}")
                    check(len(seq) == 8, "sequence frame of 8 bytes")
                    received.append((int.from_bytes(seq, "big", signed=True), payload, msgpack.unpackb(payload)))

        # --- a shared 48-token prefix (3 blocks), then different 20-token tails.
        prefix = [(7 * i + 3) % 500 + 2 for i in range(48)]
        prompts = [prefix + [(11 * i + k) % 500 + 2 for i in range(20)] for k in range(3)]
        for p in prompts:
            r = post(base + "/v1/completions", {"prompt": p, "max_tokens": 8, "temperature": 0})
            check(r["usage"]["prompt_tokens"] == len(p), "token-id prompts are taken as they are")
        drain(0.5)

        stored = {}  # hash -> (parent, tokens)
        removed = []
        for seq, _, batch in received:
            check(isinstance(batch, list) and len(batch) == 3, f"EventBatch [ts, events, dp_rank]: {batch!r}")
            ts, events, dp_rank = batch
            check(isinstance(ts, float) and abs(ts - time.time()) < 120, f"timestamp {ts}")
            check(dp_rank is None, "data_parallel_rank nil for a single replica")
            for e in events:
                if e[0] == "BlockStored":
                    check(len(e) == 8, f"BlockStored has 8 fields: {e!r}")
                    _, hashes, parent, tokens, block_size, lora_id, medium, lora_name = e
                    check(block_size == BLOCK and medium == "GPU" and lora_id is None and lora_name is None, repr(e))
                    check(len(tokens) == BLOCK * len(hashes), "block_size tokens per hash")
                    for i, h in enumerate(hashes):
                        stored[h] = (parent if i == 0 else hashes[i - 1], tokens[i * BLOCK:(i + 1) * BLOCK])
                elif e[0] == "BlockRemoved":
                    check(len(e) == 3 and e[2] == "GPU", repr(e))
                    removed.extend(e[1])
                else:
                    check(e[0] == "AllBlocksCleared", repr(e))

        def chain_of(prompt):
            """The stored hashes of the prompt's full blocks, following the parent chain."""
            parent, out = None, []
            for b in range(len(prompt) // BLOCK):
                chunk = prompt[b * BLOCK:(b + 1) * BLOCK]
                found = [h for h, (par, toks) in stored.items() if par == parent and toks == chunk]
                check(len(found) == 1, f"block {b} of a prompt: {len(found)} stored matches")
                parent = found[0]
                out.append(parent)
            return out

        chains = [chain_of(p) for p in prompts]
        check(all(c[:3] == chains[0][:3] for c in chains), "the shared prefix is one chain")
        check(len({c[3] for c in chains}) == 3, "each tail block has its own hash")
        check(not removed, "nothing evicted yet")

        # --- distinct prompts until the 24-block pool must evict.
        for k in range(8):
            p = [(13 * i + 31 * k) % 500 + 2 for i in range(80)]
            post(base + "/v1/completions", {"prompt": p, "max_tokens": 4, "temperature": 0})
        drain(0.5)
        removed, stored_at = [], {}
        for seq, _, (ts, events, _) in received:
            for e in events:
                if e[0] == "BlockStored":
                    for h in e[1]:
                        stored_at[h] = seq
                elif e[0] == "BlockRemoved":
                    for h in e[1]:
                        check(h in stored_at, f"removed block {h} was stored before")
                        removed.append(h)
        check(len(removed) >= 10, f"evictions reported: {len(removed)}")

        seqs = [s for s, _, _ in received]
        check(seqs == list(range(len(seqs))), f"gapless sequence numbers from 0: {seqs[:5]}...")

        # --- replay from sequence 2.
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", (2).to_bytes(8, "big")])
        replayed = []
        while True:
            check(dealer.poll(5000), "replay answers")
            empty, seq, payload = dealer.recv_multipart()
            n = int.from_bytes(seq, "big", signed=True)
            if n == -1:
                break
            replayed.append((n, payload))
        check(replayed == [(s, p) for s, p, _ in received if s >= 2], "replay returns what was published")

        # --- the vllm: gauges move as the peregrine: ones do.
        def same(values):
            for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
                check(values["vllm:" + name] == values["peregrine:" + name], name)

        long_req = threading.Thread(target=post, args=(base + "/v1/completions",
                                                       {"prompt": "Once upon a time", "max_tokens": 360,
                                                        "temperature": 1, "ignore_eos": True}))
        long_req.start()
        seen_running = False
        for _ in range(200):
            values, text = metrics(base)
            same(values)
            if values["vllm:num_requests_running"] == 1:
                seen_running = True
                check(values["vllm:kv_cache_usage_perc"] > 0, "usage while running")
                break
            time.sleep(0.002)
        long_req.join()
        check(seen_running, "saw the request running")
        values, text = metrics(base)
        same(values)
        check(values["vllm:num_requests_running"] == 0, "idle again")
        check(re.search(r'vllm:cache_config_info\{model_name="[^"]+",block_size="16",cache_dtype="f32",'
                        r'num_gpu_blocks="24"\} 1', text), "cache_config_info")
        print(f"ok: {len(received)} event batches, {len(stored)} blocks stored, {len(removed)} removed, "
              f"{len(replayed)} replayed")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
