"""`loom serve` driven over loopback HTTP: every endpoint, streamed and whole, the error cases, a fuzz of
request bodies that must leave the KV cache's free blocks where they started, batch invariance (32 seeded
requests alone, then all at once in shuffled order: identical tokens and logprobs), temperature 0 equal
to `loom generate`, the official `openai` client (skipped when it is not installed), and the chat page in
headless chromium (skipped when chromium is missing).

The model is tests/models/llama/fixtures/tiny_llama.gguf (a 2-layer Llama with Q8_0/Q4_1 weights and a
ChatML tokenizer), served with a ChatML template given by --chat-template (its own template is not ChatML);
and tiny GPT-2 and DeepSeek-V3 models made by the test (the `loom` module), which are served batched too.
A burst of 128 simultaneous connections must all be served (the listen backlog).
"""

import base64
import concurrent.futures
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import REPO

CLI = os.path.join(REPO, "build", "loom")
MODEL = os.path.join(REPO, "tests", "models", "llama", "fixtures", "tiny_llama.gguf")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

pytestmark = pytest.mark.skipif(not os.path.exists(CLI), reason="the CLI is built by tools/test.sh")


class Server:
    """A `loom serve` process on a free port (--port 0: it prints the one it bound)."""

    def __init__(self, *extra, weights=MODEL):
        self.dir = tempfile.mkdtemp(prefix="loom_serve_")
        template = os.path.join(self.dir, "chatml.jinja")
        with open(template, "w") as f:
            f.write(CHATML)
        cmd = [CLI, "serve", "--weights", weights, "--port", "0", "--chat-template", template, "--threads", "2",
               "--model-name", "tiny", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("loom serve did not start: " + self.proc.stderr.read())
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=30)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        return code

    def request(self, method, path, body=None, headers=None, raw=None, timeout=60):
        """(status, headers, parsed JSON or text)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if data is not None and "Content-Type" not in req.headers:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, hdrs, text = r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            status, hdrs, text = e.code, e.headers, e.read().decode()
        ctype = hdrs.get("Content-Type", "")
        return status, hdrs, (json.loads(text) if ctype.startswith("application/json") else text)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def stream(self, path, body, headers=None):
        """The events of a streamed request: a list of parsed chunks, then the literal '[DONE]'."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        events = []
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            for block in r.read().decode().split("\n\n"):
                if not block.strip():
                    continue
                assert block.startswith("data: "), block
                data = block[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
        return events

    def metric(self, name):
        _, _, text = self.request("GET", "/metrics")
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        assert m, f"{name} not in /metrics"
        return float(m.group(1))

    def settle(self):
        """Waits until nothing runs or waits; returns the free-block count."""
        for _ in range(500):
            if self.metric("loom_running_requests") == 0 and self.metric("loom_queue_length") == 0:
                return self.metric("loom_kv_blocks_free")
            time.sleep(0.02)
        raise AssertionError("the server did not settle")


@pytest.fixture(scope="module")
def server():
    s = Server("--kv-blocks", "96", "--block-size", "8", "--max-running", "16")
    yield s
    assert s.stop() == 0, s.proc.stderr.read()


# ---- endpoints ----------------------------------------------------------------------------------------

def test_health_models_metrics(server):
    status, _, body = server.request("GET", "/health")
    assert status == 200 and body["status"] == "ok" and body["mode"] == "batched"
    status, _, body = server.request("GET", "/v1/models")
    assert status == 200 and body["object"] == "list" and body["data"][0]["id"] == "tiny"
    status, hdrs, text = server.request("GET", "/metrics")
    assert status == 200 and hdrs["Content-Type"].startswith("text/plain")
    for name in ["loom_requests_submitted_total", "loom_generation_tokens_total", "loom_queue_length",
                 "loom_time_to_first_token_seconds", "loom_tokens_per_second", "loom_kv_blocks_free"]:
        assert re.search(rf"^# TYPE {name} ", text, re.M), name
    assert server.metric("loom_kv_blocks") == 96


def test_completion_whole(server):
    status, _, body = server.post("/v1/completions", {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 9,
                                                      "temperature": 0, "logprobs": 3})
    assert status == 200, body
    assert body["object"] == "text_completion" and body["model"] == "tiny" and body["id"].startswith("cmpl-")
    c = body["choices"][0]
    assert c["index"] == 0 and c["finish_reason"] in ("stop", "length")
    lp = c["logprobs"]
    n = len(lp["tokens"])
    assert body["usage"]["completion_tokens"] >= n >= 1
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    for tok_lp, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        # Three alternatives (fewer keys when two tokens' texts are the same string, as OpenAI's format has it).
        assert tok_lp <= 0 and 1 <= len(top) <= 3
        assert max(top.values()) >= tok_lp - 1e-6  # greedy: the token is the most likely one
    if c["finish_reason"] == "length":
        assert n == 9


def test_temperature_zero_equals_loom_generate(server):
    for prompt in ["The cat", "Once upon a time there was", "hello"]:
        out = subprocess.run([CLI, "generate", "--weights", MODEL, "--prompt", prompt, "--max-new-tokens", "12",
                              "--temperature", "0"], capture_output=True, text=True, check=True).stdout
        status, _, body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert status == 200, body
        c = body["choices"][0]
        if c["finish_reason"] == "length":
            assert out == prompt + c["text"] + "\n"
        else:  # an end-of-text token: `loom generate` stops there too (and prints nothing for it)
            assert out.startswith(prompt + c["text"])


def test_completion_stream_equals_whole(server):
    body = {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0.8, "seed": 7, "logprobs": 1}
    _, _, whole = server.post("/v1/completions", body)
    events = server.stream("/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    chunks = events[:-2]
    assert all(e["object"] == "text_completion" for e in chunks)
    assert "".join(e["choices"][0]["text"] for e in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(e["choices"][0]["finish_reason"] is None for e in chunks[:-1])
    streamed = [x for e in chunks if e["choices"][0]["logprobs"] for x in e["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == whole["choices"][0]["logprobs"]["token_logprobs"]


def test_chat_whole_and_stream(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
    body = {"messages": messages, "max_tokens": 15, "temperature": 0.7, "seed": 3, "logprobs": True, "top_logprobs": 2}
    status, _, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    msg = whole["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    content = whole["choices"][0]["logprobs"]["content"]
    assert all(len(t["top_logprobs"]) == 2 and isinstance(t["bytes"], list) for t in content)
    events = server.stream("/v1/chat/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(e["object"] == "chat.completion.chunk" for e in chunks)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in chunks) == msg["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    # The content parts form of a message renders as the string form does.
    parts = [messages[0], {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there!"}]}]
    _, _, again = server.post("/v1/chat/completions", {**body, "messages": parts})
    assert again["choices"][0]["message"] == msg


def test_n_choices_differ_and_stop_strings_cut(server):
    status, _, body = server.post("/v1/completions", {"prompt": "a", "max_tokens": 12, "n": 3, "seed": 11, "temperature": 1})
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    texts = [c["text"] for c in body["choices"]]
    assert len(set(texts)) > 1, texts
    # The first choice again, alone: choice 0 of a seed is reproducible.
    _, _, one = server.post("/v1/completions", {"prompt": "a", "max_tokens": 12, "seed": 11, "temperature": 1})
    assert one["choices"][0]["text"] == texts[0]
    # A stop string taken from a greedy reply cuts it there.
    for prompt in ["Once upon a time", "The cat", "hello", "a b c"]:
        _, _, free = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 20, "temperature": 0})
        text = free["choices"][0]["text"]
        cut = next((ch for ch in text if ch.isascii() and ch.isalnum()), None)
        if cut is not None:
            break
    else:
        pytest.fail("no greedy reply has an ASCII letter to stop at")
    _, _, stopped = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 20, "temperature": 0, "stop": [cut]})
    assert stopped["choices"][0]["text"] == text[:text.index(cut)]
    assert stopped["choices"][0]["finish_reason"] == "stop"


# ---- errors --------------------------------------------------------------------------------------------

def expect_error(result, status, param=None, code=None):
    got, _, body = result
    assert got == status, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"] and "type" in err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err


def test_errors_name_the_field(server):
    post = server.post
    expect_error(post("/v1/completions", None, raw=b"{not json"), 400)
    expect_error(post("/v1/completions", [1, 2]), 400)
    expect_error(post("/v1/completions", None, raw=b"[" * 400_000 + b"]" * 400_000), 400)  # nested past 64 levels
    expect_error(post("/v1/completions", None, raw=b'{"prompt": "x", "stop": ' + b"[" * 100 + b"]" * 100 + b"}"), 400)
    expect_error(post("/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404, "model", "model_not_found")
    expect_error(post("/v1/completions", {}), 400, "prompt")
    expect_error(post("/v1/completions", {"prompt": 5}), 400, "prompt")
    expect_error(post("/v1/completions", {"prompt": [1, 10 ** 9]}), 400, "prompt")
    expect_error(post("/v1/completions", {"prompt": "word " * 400}), 400, "prompt")  # past the 128-token context
    expect_error(post("/v1/completions", {"prompt": "x", "max_tokens": 500}), 400, "max_tokens")
    expect_error(post("/v1/completions", {"prompt": "x", "max_tokens": 0}), 400, "max_tokens")
    expect_error(post("/v1/completions", {"prompt": "x", "max_tokens": "ten"}), 400, "max_tokens")
    expect_error(post("/v1/completions", {"prompt": "x", "temperature": -1}), 400, "temperature")
    expect_error(post("/v1/completions", {"prompt": "x", "temperature": 1e308 * 10}), 400)  # inf is not JSON
    expect_error(post("/v1/completions", {"prompt": "x", "top_p": 0}), 400, "top_p")
    expect_error(post("/v1/completions", {"prompt": "x", "top_k": -5}), 400, "top_k")
    expect_error(post("/v1/completions", {"prompt": "x", "n": 0}), 400, "n")
    expect_error(post("/v1/completions", {"prompt": "x", "n": 1000}), 400, "n")
    expect_error(post("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}), 400, "stop")
    expect_error(post("/v1/completions", {"prompt": "x", "stop": ""}), 400, "stop")
    expect_error(post("/v1/completions", {"prompt": "x", "logprobs": 50}), 400, "logprobs")
    expect_error(post("/v1/completions", {"prompt": "x", "seed": "s"}), 400, "seed")
    expect_error(post("/v1/completions", {"prompt": "x", "stream": "yes"}), 400, "stream")
    expect_error(post("/v1/completions", {"prompt": "x", "echo": True}), 400, "echo")
    expect_error(post("/v1/completions", {"prompt": "x", "presence_penalty": 1}), 400, "presence_penalty")
    expect_error(post("/v1/chat/completions", {"messages": []}), 400, "messages")
    expect_error(post("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}), 400, "messages")
    expect_error(post("/v1/chat/completions", {"messages": [{"content": "x"}]}), 400, "messages")
    expect_error(post("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}), 400, "messages")
    expect_error(post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
                 400, "top_logprobs")
    # A body past the 1 MiB limit is refused (cpp-httplib reads it past, unparsed, then answers 413).
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 2000000\r\n\r\n" + b" " * 2_000_000)
    # Read to the end of the response: its head and body may arrive in separate packets.
    sock.settimeout(30)
    raw = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        raw += chunk
        head_end = raw.find(b"\r\n\r\n")
        if head_end >= 0:
            length = re.search(rb"Content-Length: (\d+)", raw[:head_end], re.IGNORECASE)
            if length and len(raw) >= head_end + 4 + int(length.group(1)):
                break
    sock.close()
    head = raw.decode(errors="replace")
    assert head.startswith("HTTP/1.1 413"), head
    assert '"error"' in head
    expect_error(server.request("GET", "/v1/nothing"), 404)
    expect_error(server.request("GET", "/v1/completions"), 404)
    assert server.request("GET", "/health")[0] == 200  # still serving


def test_queue_full_is_429_with_retry_after():
    s = Server("--kv-blocks", "64", "--block-size", "8", "--max-running", "1", "--max-queued", "4")
    try:
        base = s.settle()
        # 16 samples of one request are 16 submissions in a row: one runs, four wait, the sixth is refused
        # (the ones already submitted are cancelled).
        status, hdrs, body = s.post("/v1/completions", {"prompt": "a", "max_tokens": 100, "n": 16})
        assert status == 429, body
        assert body["error"]["code"] == "queue_full" and int(hdrs["Retry-After"]) >= 1
        assert s.settle() == base
        assert s.metric('loom_requests_rejected_total{reason="queue_full"}') == 1
    finally:
        assert s.stop() == 0


def test_api_key_is_required_when_set():
    s = Server("--api-key", "sesame", "--kv-blocks", "32", "--block-size", "8", "--max-running", "2")
    try:
        expect_error(s.post("/v1/completions", {"prompt": "x", "max_tokens": 2}), 401, code="invalid_api_key")
        expect_error(s.post("/v1/completions", {"prompt": "x", "max_tokens": 2},
                            headers={"Authorization": "Bearer sesamf"}), 401)
        status, _, _ = s.post("/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"Authorization": "Bearer sesame"})
        assert status == 200
        assert s.request("GET", "/health")[0] == 200  # health and metrics stay open
    finally:
        assert s.stop() == 0


def test_sigterm_drains_running_requests_and_refuses_new_ones():
    s = Server("--kv-blocks", "64", "--block-size", "8", "--max-running", "1")
    events, done = [], threading.Event()

    def long_stream():
        try:
            events.extend(s.stream("/v1/completions", {"prompt": "a", "max_tokens": 110, "n": 16, "stream": True}))
        finally:
            done.set()

    t = threading.Thread(target=long_stream)
    t.start()
    # The signal once the request runs, the next request once the server says it drains (its stderr), so
    # that it comes during the drain however fast the machine (fixed sleeps let the drain end first).
    for _ in range(1000):
        if s.metric("loom_running_requests") > 0 or done.is_set():
            break
        time.sleep(0.001)
    assert not done.is_set(), "the long request ended before the signal could be sent"
    s.proc.send_signal(signal.SIGTERM)
    while "draining" not in (line := s.proc.stderr.readline()):
        assert line, "loom serve ended without saying it drains"
    refused = s.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
    t.join()
    code = s.stop()
    assert code == 0
    assert events and events[-1] == "[DONE]"  # the running request finished
    finishes = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"][0]["finish_reason"]]
    assert len(finishes) == 16
    expect_error(refused, 503, code="draining")
    assert int(refused[1]["Retry-After"]) >= 1


# ---- robustness ----------------------------------------------------------------------------------------

def test_fuzzed_bodies_never_crash_nor_leak_blocks(server):
    base = server.settle()
    rng = random.Random(1234)
    values = [None, True, False, 0, -1, 1, 2, 7, 2 ** 31, 2 ** 63, -2 ** 63, 1.5, -0.0, 1e300, "", "x", "\u00e9\u4e2d",
              "\U0001f600", [], [1], ["a"], [0, 1, 2], {}, {"a": 1}, "<|im_start|>", "a" * 300]
    keys = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
            "stop", "seed", "stream", "stream_options", "logprobs", "top_logprobs", "echo", "user", "bogus"]
    bodies = []
    for _ in range(150):
        body = {"prompt": "hi", "max_tokens": rng.randint(1, 6)} if rng.random() < 0.5 else \
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": rng.randint(1, 6)}
        for _ in range(rng.randint(1, 4)):
            key = rng.choice(keys)
            if key == "messages" and rng.random() < 0.5:
                body[key] = [{"role": rng.choice(["user", "system", "assistant", "x", 3]), "content": rng.choice(values)}]
            else:
                body[key] = rng.choice(values)
        raw = json.dumps(body).encode()
        if rng.random() < 0.1:
            raw = raw[:rng.randint(0, len(raw))]  # truncated
        bodies.append((rng.choice(["/v1/completions", "/v1/chat/completions"]), raw))

    def send(item):
        path, raw = item
        status, _, body = server.request("POST", path, raw=raw)
        if status != 200:
            assert 400 <= status < 500 and "error" in body, (raw, status, body)
        return status

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(send, bodies))
    assert 200 in statuses and any(400 <= x < 500 for x in statuses)
    assert server.settle() == base
    assert server.request("GET", "/health")[0] == 200


def test_a_client_that_disconnects_leaves_no_blocks_behind(server):
    base = server.settle()
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", server.port))
        body = json.dumps({"prompt": "a", "max_tokens": 100, "n": 8, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        sock.recv(64)  # the response has started
        sock.close()
    assert server.settle() == base


def check_batch_invariance(server):
    """32 seeded requests one at a time, then all at once in shuffled order: the same tokens and logprobs."""
    rng = random.Random(5)
    words = "the a cat dog sat on mat ran far away and then slept quietly under tree".split()
    bodies = []
    for i in range(32):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 14)))
        if i % 4 == 0:
            prompt = "the cat sat on the mat and then the dog ran far away " + prompt  # a shared prefix
        bodies.append({"prompt": prompt, "max_tokens": rng.randint(4, 24), "seed": 1000 + i, "logprobs": 2,
                       "temperature": rng.choice([0, 0.7, 1.0]), "top_k": rng.choice([0, 20]), "top_p": rng.choice([1, 0.9])})

    def run(body):
        status, _, out = server.post("/v1/completions", body)
        assert status == 200, out
        c = out["choices"][0]
        return c["text"], c["finish_reason"], c["logprobs"]

    alone = [run(b) for b in bodies]
    order = list(range(32))
    random.Random(6).shuffle(order)
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        futures = {i: pool.submit(run, bodies[i]) for i in order}
        together = {i: f.result() for i, f in futures.items()}
    for i in range(32):
        assert together[i] == alone[i], f"request {i} differs beside others"
    assert server.metric("loom_prefix_cache_hits_total") > 0


def test_batch_invariance_32_seeded_requests(server):
    check_batch_invariance(server)


def test_a_burst_of_128_connections_is_never_reset(server):
    """128 clients connect at the same moment: every one is served, none reset or refused (cpp-httplib
    listens with a backlog of 5; loom serve widens it to the system's maximum)."""
    if shutil.which("ss"):  # the listening socket's backlog is its Send-Q
        out = subprocess.run(["ss", "-Hltn", f"sport = :{server.port}"], capture_output=True, text=True).stdout
        backlogs = [int(line.split()[2]) for line in out.splitlines() if line.strip()]
        assert backlogs and min(backlogs) >= 128, out
    n = 128
    barrier = threading.Barrier(n)

    def client(_):
        barrier.wait()
        try:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            sock.settimeout(30)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            sock.close()
            return data.split(b"\r\n", 1)[0].decode(errors="replace")
        except OSError as e:
            return repr(e)

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(client, range(n)))
    failed = [r for r in results if not r.startswith("HTTP/1.1 200")]
    assert not failed, f"{len(failed)} of {n} connections failed: {sorted(set(failed))}"


# ---- GPT-2 and DeepSeek-V3: batched too ---------------------------------------------------------------

# Every token one printable ASCII character, so texts compare exactly with `loom generate`'s output.
ASCII_VOCAB = {i: bytes([32 + i]) for i in range(95)}


@pytest.fixture(scope="module", params=["gpt2", "deepseek_v3"])
def family_server(request, tmp_path_factory):
    """`loom serve` over a tiny model of the family made here (random weights, seeded), with an ASCII tokenizer."""
    loom = pytest.importorskip("loom", reason="the loom Python module is built by tools/test.sh")
    if request.param == "gpt2":
        section = {"arch": "gpt2", "vocab_size": 95, "context_length": 256, "d_model": 32, "num_layers": 2,
                   "num_heads": 4}
    else:  # MLA over a latent cache, a dense layer and a MoE layer (a shared expert, routed ones)
        section = dict(loom.resolve_config("dsv3-tiny")["model"], vocab_size=95, context_length=256)
    directory = tmp_path_factory.mktemp(request.param)
    weights = str(directory / "model.safetensors")
    loom.Model.from_config(section, seed=11).save(weights)
    loom.Tokenizer(ASCII_VOCAB, []).save(directory / "tokenizer.json")
    s = Server("--kv-blocks", "128", "--block-size", "8", "--max-running", "32", weights=weights)
    s.weights = weights
    yield s
    assert s.stop() == 0, s.proc.stderr.read()


def test_families_are_served_batched_and_greedy_equals_loom_generate(family_server):
    status, _, body = family_server.request("GET", "/health")
    assert status == 200 and body["mode"] == "batched", body
    for prompt in ["The cat", "Once upon a time there was", "hello"]:
        out = subprocess.run([CLI, "generate", "--weights", family_server.weights, "--prompt", prompt,
                              "--max-new-tokens", "12", "--temperature", "0"], capture_output=True, text=True,
                             check=True).stdout
        status, _, body = family_server.post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert status == 200, body
        assert body["choices"][0]["finish_reason"] == "length"  # no end-of-text token in this vocabulary
        assert out == prompt + body["choices"][0]["text"] + "\n"


def test_families_batch_invariance_32_seeded_requests(family_server):
    base = family_server.settle()
    check_batch_invariance(family_server)
    assert family_server.settle() == base


# ---- the official client ---------------------------------------------------------------------------------

def test_the_openai_client(server):
    openai = pytest.importorskip("openai", reason="the openai package is not installed (pip install openai)")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny"]
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                          seed=1, temperature=0.5)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens >= 1
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8, seed=1, temperature=0.5, stream=True)
        if c.choices]
    assert "".join(pieces) == chat.choices[0].message.content
    comp = client.completions.create(model="tiny", prompt="The cat", max_tokens=6, temperature=0, logprobs=2)
    assert comp.choices[0].finish_reason in ("stop", "length") and len(comp.choices[0].logprobs.token_logprobs) >= 1
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=10_000)
    assert "max_tokens" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x", max_tokens=1)


# ---- the chat page in a browser ---------------------------------------------------------------------------

def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """The Chrome DevTools Protocol over a minimal WebSocket client (the standard library has none)."""

    def __init__(self, ws_url):
        host, port, path = re.match(r"ws://([^:/]+):(\d+)(/.*)", ws_url).groups()
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        assert b" 101 " in response.split(b"\r\n")[0], response
        self.buffer = response.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def _recv_exact(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("devtools closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def _send(self, text):
        payload = text.encode()
        header = bytes([0x81])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _recv(self):
        message = b""
        while True:
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            message += self._recv_exact(n)
            if b0 & 0x80:
                return json.loads(message.decode())

    def call(self, method, **params):
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = self._recv()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def evaluate(self, expression):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


def test_the_chat_page_in_headless_chromium(server, tmp_path):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (tools/setup.sh installs it)")
    profile = tmp_path / "profile"
    browser = subprocess.Popen([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1000,700",
                                "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().count("\n") >= 1:
                break
            time.sleep(0.1)
        else:
            pytest.fail("chromium did not start its DevTools endpoint")
        port = int(port_file.read_text().split("\n")[0])
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(p for p in pages if p["type"] == "page")
        dt = DevTools(page["webSocketDebuggerUrl"])
        dt.call("Page.enable")
        dt.call("Page.navigate", url=server.url + "/")
        for _ in range(100):
            if dt.evaluate("document.readyState") == "complete" and dt.evaluate("!!document.getElementById('input')"):
                break
            time.sleep(0.1)
        assert dt.evaluate("document.title") == "loom serve: tiny"
        # Greedy, so the reply can be checked against the API; then type the message and press Enter.
        dt.evaluate("document.getElementById('temperature').value = '0'; document.getElementById('max_tokens').value = '12'")
        dt.evaluate("document.getElementById('input').focus()")
        dt.call("Input.insertText", text="Hello, who are you?")
        for kind in ("keyDown", "keyUp"):
            dt.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                    **({"text": "\r"} if kind == "keyDown" else {}))
        reply = None
        for _ in range(200):
            state = dt.evaluate("(document.querySelector('.assistant') || {dataset: {}}).dataset.state || "
                                "(document.querySelector('.error') ? 'error' : '')")
            if state == "done":
                reply = dt.evaluate("(() => { const a = document.querySelector('.assistant'), m = a.querySelector('.meta');"
                                    " return a.textContent.slice(0, a.textContent.length - m.textContent.length); })()")
                break
            assert state != "error", dt.evaluate("document.querySelector('.error').textContent")
            time.sleep(0.05)
        assert reply is not None, "no reply appeared on the page"
        assert dt.evaluate("document.querySelector('.user').textContent") == "Hello, who are you?"
        _, _, api = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello, who are you?"}],
                                                          "max_tokens": 12, "temperature": 0})
        assert reply == api["choices"][0]["message"]["content"]
        shot = os.environ.get("LOOM_SERVE_SCREENSHOT")
        if shot:
            data = dt.call("Page.captureScreenshot", format="png")["data"]
            with open(shot, "wb") as f:
                f.write(base64.b64decode(data))
    finally:
        browser.kill()
        browser.wait()


def test_the_native_load_generator_counts_each_token_and_names_a_refusal(server, tmp_path):
    """bench/serve_load.cpp, serve_bench's default clients: each request's events timed and its stream read
    to the end (chunked bodies decoded), client by client in order; a 4xx ends it with the server's answer
    in its message, and a bodies file of the wrong length is refused."""
    gen = os.path.join(REPO, "build", "bench", "loom_bench_serve_load")
    if not os.access(gen, os.X_OK):
        pytest.skip("build/bench/loom_bench_serve_load is not built (Google Benchmark missing)")
    bodies = tmp_path / "bodies.jsonl"
    prompts = ["Once upon a time", "The capital of France is", "def f(x):", "Hello"]
    bodies.write_text("".join(json.dumps({"prompt": p, "max_tokens": 5, "temperature": 0, "stream": True}) + "\n"
                              for p in prompts))
    out = subprocess.run([gen, "127.0.0.1", str(server.port), str(bodies), "2", "2"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    level, requests = lines[0], lines[1:]
    assert level["wall_s"] > 0 and level["cpu_s"] >= 0 and len(requests) == 4
    # The server sends a token an event, unless its writer finds several waiting (a reader that fell behind),
    # and text it held back (this model's tokens are often parts of characters) comes in one more event if
    # the writer ran before the finish: between 1 and max_tokens + 1 events a request, each stream read to
    # its [DONE].
    for i, r in enumerate(requests):
        assert r["client"] == i // 2 and 1 <= len(r["times"]) <= 6 and r["done"], r
        assert r["start"] <= r["times"][0] and r["times"] == sorted(r["times"])
    bodies.write_text(json.dumps({"prompt": "x", "max_tokens": -3, "stream": True}) + "\n")
    bad = subprocess.run([gen, "127.0.0.1", str(server.port), str(bodies), "1", "1"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "400" in bad.stderr and "max_tokens" in bad.stderr, bad.stderr
    wrong = subprocess.run([gen, "127.0.0.1", str(server.port), str(bodies), "2", "1"], capture_output=True,
                           text=True, timeout=60)
    assert wrong.returncode != 0 and "has 1 lines, expected 2" in wrong.stderr, wrong.stderr


@pytest.mark.parametrize("generator", ["native", "python"])
def test_serve_bench_runs_rounds_and_reports_the_median_ratio(generator):
    """tools/serve_bench.py against loom alone on the tiny model, with either load generator: every (round,
    level) line, then the per-round ratios over the first level and their median; --rounds 0 is refused by
    name."""
    if generator == "native" and not os.access(os.path.join(REPO, "build", "bench", "loom_bench_serve_load"), os.X_OK):
        pytest.skip("build/bench/loom_bench_serve_load is not built (Google Benchmark missing)")
    bench = os.path.join(REPO, "tools", "serve_bench.py")
    cmd = [sys.executable, bench, "--gguf", MODEL, "--threads", "1", "--no-llamacpp", "--load-generator", generator,
           "--concurrency", "1,2", "--rounds", "2", "--requests", "2", "--max-tokens", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    levels = [(r["round"], r["concurrency"]) for r in lines if "concurrency" in r]
    assert levels == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(r["tokens"] > 0 and r["requests"] == 2 for r in lines if "concurrency" in r)
    ratio = [r for r in lines if "ratio" in r]
    assert len(ratio) == 1 and ratio[0]["ratio"] == "2 over 1 clients" and len(ratio[0]["per_round"]) == 2
    assert min(ratio[0]["per_round"]) <= ratio[0]["median"] <= max(ratio[0]["per_round"])
    bad = subprocess.run(cmd[:-6] + ["--rounds", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--rounds must be at least 1, got 0" in bad.stderr
