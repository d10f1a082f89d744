#!/usr/bin/python3
"""deploy/nginx/peregrine.conf, run by Debian's nginx in front of two `peregrine serve` replicas.

The file is used as written except for its ports: the two `server` lines of the upstream get
the replicas' addresses and `listen` a free port. It must keep the directives streaming
depends on (least_conn, proxy_buffering off, HTTP/1.1, read timeout, the WebSocket upgrade
headers). Checks, through nginx:
  - a streamed completion (SSE) arrives event by event while it is generated (many separate
    reads spread over the generation, the first long before the end), ends with
    `data: [DONE]`, and carries the same text as the request without streaming;
  - /v1/ws is upgraded to a WebSocket and streams a completion;
  - least_conn spreads requests over both replicas.
A self-check feeds the same stream to the timing check as one late read: it must be refused.
Every step has a deadline; the processes are stopped on exit.

usage: nginx_test.py PEREGRINE_BINARY [REPO_ROOT]"""
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

MODEL = "stories260K"
STREAM_TOKENS = 400  # ~0.1 s of generation on one thread: long enough to see the spread
PROMPT = "Once upon a time"


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_replica(binary, work, i):
    log = open(os.path.join(work, f"replica-{i}.log"), "w+b")
    proc = subprocess.Popen([binary, "serve", "--port", "0", "--device", "cpu", "--threads", "1"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    return proc, log


def wait_ready(proc, log, deadline):
    while time.monotonic() < deadline:
        log.seek(0)
        m = re.search(rb"ready: serving '[^']*' at http://([0-9.]+):([0-9]+)/v1", log.read())
        if m:
            return m.group(1).decode(), int(m.group(2))
        check(proc.poll() is None, f"replica exited with {proc.returncode} before it was ready")
        time.sleep(0.05)
    raise Failure("replica not ready in time")


# Directives the file must keep (what the streaming check cannot see on its own: Peregrine
# also sends "X-Accel-Buffering: no", so a stream passes even where proxy_buffering is on).
REQUIRED = [
    (r"upstream\s+peregrine\s*\{[^}]*\bleast_conn;", "least_conn in the upstream"),
    (r"location\s+/\s*\{[^}]*\bproxy_buffering\s+off;", "proxy_buffering off for /"),
    (r"location\s+/\s*\{[^}]*\bproxy_http_version\s+1\.1;", "proxy_http_version 1.1 for /"),
    (r"location\s+/\s*\{[^}]*\bproxy_read_timeout\s+\d+s;", "proxy_read_timeout for /"),
    (r"location\s+/v1/ws\s*\{[^}]*\bproxy_set_header\s+Upgrade\s+\$http_upgrade;", "Upgrade header for /v1/ws"),
    (r"location\s+/v1/ws\s*\{[^}]*\bproxy_set_header\s+Connection\s+\"?upgrade\"?;", "Connection upgrade for /v1/ws"),
]


def adapt_config(text, backends, listen_port):
    """peregrine.conf with the upstream's server addresses and the listen port replaced."""
    bare = re.sub(r"#.*", "", text)
    for pattern, what in REQUIRED:
        check(re.search(pattern, bare), f"peregrine.conf: missing {what}")
    up = re.search(r"upstream\s+peregrine\s*\{(.*?)\n\}", text, re.S)
    check(up, "peregrine.conf: no `upstream peregrine { ... }` block")
    servers = re.findall(r"^\s*server\s+\S+", up.group(1), re.M)
    check(len(servers) == len(backends), f"peregrine.conf: {len(servers)} upstream servers, expected {len(backends)}")
    it = iter(backends)
    block = re.sub(r"^(\s*server\s+)\S+", lambda m: m.group(1) + next(it), up.group(1), flags=re.M)
    text = text[:up.start(1)] + block + text[up.end(1):]
    text, n = re.subn(r"^(\s*listen\s+)[^;\s]+", rf"\g<1>127.0.0.1:{listen_port}", text, flags=re.M)
    check(n == 1, f"peregrine.conf: {n} listen directives, expected 1")
    return text


def main_config(work, conf_path):
    t = lambda name: os.path.join(work, name)  # noqa: E731
    # master_process off: one process, as the caller, no user switch (temp paths stay ours).
    return f"""daemon off;
master_process off;
worker_processes 1;
pid {t('nginx.pid')};
error_log {t('error.log')} info;
events {{ worker_connections 256; }}
http {{
    access_log {t('access.log')};
    client_body_temp_path {t('client_body')};
    proxy_temp_path {t('proxy')};
    fastcgi_temp_path {t('fastcgi')};
    uwsgi_temp_path {t('uwsgi')};
    scgi_temp_path {t('scgi')};
    include {conf_path};
}}
"""


def wait_listening(port, proc, deadline):
    while time.monotonic() < deadline:
        check(proc.poll() is None, f"nginx exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise Failure("nginx not listening in time")


def post(port, path, body, timeout=30):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def health(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        return json.loads(r.read())


def raw_stream(port, body, deadline):
    """POSTs a streamed completion over a plain socket; returns [(seconds since send, bytes)],
    one entry per recv(), so that the arrival of every piece is known."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    t0 = time.monotonic()
    reads = []
    try:
        while True:
            check(time.monotonic() < deadline, "stream not finished in time")
            b = s.recv(65536)
            if not b:
                break
            reads.append((time.monotonic() - t0, b))
    finally:
        s.close()
    return reads


def sse_events(reads):
    """Decodes an HTTP/1.1 response read piecewise: (status, headers, [(arrival, event bytes)]).
    An event's arrival is the time of the read that completed it."""
    buf = b""
    head = None
    body = b""  # de-chunked, not yet split into events
    pending = b""  # chunked framing not yet decoded
    events = []
    for t, piece in reads:
        if head is None:
            buf += piece
            if b"\r\n\r\n" not in buf:
                continue
            head, piece = buf.split(b"\r\n\r\n", 1)
        pending += piece
        while True:  # chunked transfer coding
            nl = pending.find(b"\r\n")
            if nl < 0:
                break
            size = int(pending[:nl].split(b";")[0], 16)
            if len(pending) < nl + 2 + size + 2:
                break
            body += pending[nl + 2:nl + 2 + size]
            pending = pending[nl + 2 + size + 2:]
        while b"\n\n" in body:
            ev, body = body.split(b"\n\n", 1)
            events.append((t, ev))
    check(head is not None, "no HTTP response header")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    check(headers.get("transfer-encoding", "").lower() == "chunked", f"response not chunked: {headers}")
    return status, headers, events


def check_spread(events):
    """The events arrived one by one during the generation: in at least 10 separate reads, the
    first before half of the stream's time had passed. A buffering proxy sends them in one
    or a few reads at the end. Returns a one-line description."""
    check(len(events) >= 2, "fewer than two events")
    times = [t for t, _ in events]
    groups = len(set(times))
    first, last = times[0], times[-1]
    desc = (f"{len(events)} events in {groups} reads, first at {first * 1000:.1f} ms, "
            f"[DONE] at {last * 1000:.1f} ms")
    check(groups >= 10, "events not streamed one by one: " + desc)
    check(first <= 0.5 * last, "first event arrived late, as if buffered: " + desc)
    return desc


def stream_through(port, deadline):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": STREAM_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True}
    reads = raw_stream(port, body, deadline)
    status, headers, events = sse_events(reads)
    check(status == 200, f"status {status}")
    check(headers.get("content-type", "").startswith("text/event-stream"), f"content-type {headers.get('content-type')}")
    check(events and events[-1][1] == b"data: [DONE]", "the stream does not end with data: [DONE]")
    text = ""
    for _, ev in events[:-1]:
        check(ev.startswith(b"data: "), f"not an SSE data line: {ev[:80]!r}")
        chunk = json.loads(ev[len(b"data: "):])
        check("error" not in chunk, f"error event: {chunk}")
        text += chunk["choices"][0]["text"]
    # About one chunk a token (a chunk may hold several when text is held back, e.g. a partial
    # UTF-8 sequence).
    check(len(events) - 1 >= STREAM_TOKENS // 2, f"{len(events) - 1} chunks for {STREAM_TOKENS} tokens")
    return reads, events, text


def ws_frame(payload):
    """A masked text frame (clients must mask)."""
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_parse(buf):
    """(opcode, payload, rest) of the first whole server frame in buf (unmasked), else None."""
    if len(buf) < 2:
        return None
    n, off = buf[1] & 0x7F, 2
    if n >= 126:
        off = 4 if n == 126 else 10
        if len(buf) < off:
            return None
        n = int.from_bytes(buf[2:off], "big")
    if len(buf) < off + n:
        return None
    return buf[0] & 0x0F, buf[off:off + n], buf[off + n:]


def ws_completion(port, deadline):
    """Upgrades /v1/ws through nginx, sends one completion, reads until its `done`."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall((f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            check(time.monotonic() < deadline, "no WebSocket handshake answer in time")
            b = s.recv(4096)
            check(b, "connection closed during the WebSocket handshake")
            buf += b
        head, buf = buf.split(b"\r\n\r\n", 1)
        check(head.startswith(b"HTTP/1.1 101"), f"WebSocket upgrade refused: {head.splitlines()[0]!r}")
        msg = {"id": "w1", "type": "completion",
               "request": {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}}
        s.sendall(ws_frame(json.dumps(msg).encode()))
        chunks = 0
        while True:
            frame = ws_parse(buf)
            while frame is None:
                check(time.monotonic() < deadline, "WebSocket answer not complete in time")
                b = s.recv(65536)
                check(b, "WebSocket closed before `done`")
                buf += b
                frame = ws_parse(buf)
            opcode, payload, buf = frame
            check(opcode != 0x8, "WebSocket closed by the server before `done`")
            if opcode != 0x1:
                continue
            m = json.loads(payload)
            check(m.get("type") != "error", f"WebSocket error: {m}")
            if m.get("type") == "chunk":
                chunks += 1
            if m.get("type") == "done":
                check(chunks >= 1, "`done` without a chunk")
                return chunks
    finally:
        s.close()


def main():
    binary = os.path.abspath(sys.argv[1])
    root = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    check(os.access(nginx, os.X_OK), "nginx not found (Debian package nginx)")
    with open(os.path.join(root, "deploy", "nginx", "peregrine.conf")) as f:
        conf = f.read()

    work = tempfile.mkdtemp(prefix="pg-nginx-")
    os.chmod(work, 0o755)
    procs = []
    try:
        deadline = time.monotonic() + 30
        replicas = [start_replica(binary, work, i) for i in (1, 2)]
        procs += [p for p, _ in replicas]
        addrs = [wait_ready(p, log, deadline) for p, log in replicas]

        port = free_port()
        conf_path = os.path.join(work, "peregrine.conf")
        with open(conf_path, "w") as f:
            f.write(adapt_config(conf, [f"{h}:{p}" for h, p in addrs], port))
        main_path = os.path.join(work, "nginx.conf")
        with open(main_path, "w") as f:
            f.write(main_config(work, conf_path))
        args = [nginx, "-p", work, "-c", main_path, "-e", os.path.join(work, "error.log")]
        t = subprocess.run(args + ["-t"], capture_output=True, text=True, timeout=10)
        check(t.returncode == 0, "nginx -t refused the config:\n" + t.stderr)
        ngx = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(ngx)
        wait_listening(port, ngx, time.monotonic() + 10)

        # 1. SSE through nginx, event by event.
        reads, events, streamed_text = stream_through(port, time.monotonic() + 30)
        spread = check_spread(events)
        plain = post(port, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": STREAM_TOKENS,
                                               "temperature": 0, "ignore_eos": True})
        check(plain["choices"][0]["text"] == streamed_text, "streamed text differs from the same request unstreamed")

        # Self-check: the same bytes arriving in one read at the end must be refused.
        try:
            check_spread(sse_events([(reads[-1][0], b"".join(b for _, b in reads))])[2])
            raise AssertionError("self-check: the timing check accepted a fully buffered stream")
        except Failure:
            pass

        # 2. WebSocket upgrade on /v1/ws.
        ws_chunks = ws_completion(port, time.monotonic() + 15)

        # 3. Both replicas serve (least_conn: equal loads alternate).
        for _ in range(4):
            post(port, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
        served = [health(p)["requests_served"] for _, p in addrs]
        check(all(n > 0 for n in served), f"requests per replica: {served}")

        print(f"nginx test: ok (SSE: {spread}; WebSocket: {ws_chunks} chunks; requests per replica: {served})")
        return 0
    except (Failure, AssertionError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        print(f"nginx test: FAILED: {e}", file=sys.stderr)
        for name in sorted(os.listdir(work)):
            if name.endswith(".log"):
                with open(os.path.join(work, name), errors="replace") as f:
                    tail = f.read()[-2000:]
                print(f"--- {name} (tail)\n{tail}", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
