#!/usr/bin/env python3
"""Writes the golden disaggregated exchanges in tests/fixtures/disaggregation/.

Made with the peers' own routers, as PyPI ships them: vllm-router (vLLM's router, its
`--vllm-pd-disaggregation` mode with the NIXL connector) and sglang-router (SGLang's
gateway, `--pd-disaggregation`). Each runs in front of two capture engines (below, on
loopback): a prefill engine that answers as vLLM's NIXL connector does (`kv_transfer_params`
naming the blocks it keeps) and a decode engine; each engine records every request it
is sent. The same client requests go through each router; the fixture holds, per
request, what the prefill and the decode engine received.

tests/disaggregation.rs sends the same client requests through switchyard, in front of
engine-sim engines recording what they receive (`engine-sim --record`), and checks the
protocol's fields against these: no network, no peer needed at test time.

    scripts/golden/disaggregation.py            # installs the pinned routers into target/golden-venv
"""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "disaggregation"
VENV = ROOT / "target" / "golden-venv"
PEERS = {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}
BOOTSTRAP_PORT = 8998

# What the client sends: whole and streamed chat, a completion, and the token limits the
# prefill rewrites.
CLIENT = [
    ("/v1/chat/completions",
     {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "Hello!"}]}),
    ("/v1/chat/completions",
     {"model": "demo", "max_tokens": 8, "min_tokens": 2, "stream": True,
      "stream_options": {"include_usage": True},
      "messages": [{"role": "user", "content": "Tell me a story."}]}),
    ("/v1/completions",
     {"model": "demo", "max_tokens": 4, "prompt": "The capital of France is"}),
]

# The NIXL connector's answer (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
# NixlConnectorScheduler.request_finished).
PREFILL_ANSWER = {
    "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2],
    "remote_engine_id": "engine-p", "remote_request_id": "r-1", "remote_host": "127.0.0.1",
    "remote_port": 5600, "tp_size": 1,
}


class Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.startswith("/v1/models"):
            return self.send_json({"object": "list", "data": [{"id": "demo", "object": "model"}]})
        self.send_json({"status": "ok", "model_path": "demo", "served_model_name": "demo"})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.loads(raw)
        if not self.path.endswith("/render"):  # vllm-router's own tokenization probe
            self.server.received.append({
                "path": self.path,
                "x-request-id": self.headers.get("x-request-id"),
                "body": body,
            })
        chat = "chat" in self.path
        if body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            delta = {"delta": {"content": "hi"}} if chat else {"text": "hi"}
            for line in [json.dumps({"id": "c", "model": "demo", "choices": [dict(index=0, **delta)]}), "[DONE]"]:
                data = f"data: {line}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
            return
        choice = {"message": {"role": "assistant", "content": "hi"}} if chat else {"text": "hi"}
        answer = {"id": "c", "model": "demo", "choices": [dict(index=0, finish_reason="length", **choice)],
                  "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
        if self.server.side == "prefill" and body.get("kv_transfer_params"):
            answer["kv_transfer_params"] = PREFILL_ANSWER
        self.send_json(answer)


def engine(side):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    server.side, server.received = side, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install():
    pip = VENV / "bin" / "pip"
    if not pip.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    wanted = [f"{name}=={version}" for name, version in PEERS.items()]
    subprocess.run([str(pip), "install", "--quiet", "--disable-pip-version-check", *wanted], check=True)


def wait_ready(port, process):
    deadline = time.time() + 60
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the router exited ({process.returncode})")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the router did not come up in 60 s")


def capture(router, flags):
    prefill, decode = engine("prefill"), engine("decode")
    p, d = (f"http://127.0.0.1:{s.server_address[1]}" for s in (prefill, decode))
    port = free_port()
    if router == "vllm-router":
        command = ["vllm-router", "--vllm-pd-disaggregation", "--kv-connector", "nixl",
                   "--prefill", p, "--decode", d]
    else:
        command = ["sglang-router", "launch", "--pd-disaggregation",
                   "--prefill", p, str(BOOTSTRAP_PORT), "--decode", d]
    command += ["--host", "127.0.0.1", "--port", str(port), *flags]
    process = subprocess.Popen([str(VENV / "bin" / command[0]), *command[1:]],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    exchanges = []
    try:
        wait_ready(port, process)
        for path, client in CLIENT:
            before = (len(prefill.received), len(decode.received))
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(client).encode(),
                                             {"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as answer:
                answer.read()
            time.sleep(0.2)  # SGLang's prefill runs beside the decode
            sent_p, sent_d = prefill.received[before[0]:], decode.received[before[1]:]
            assert len(sent_p) == 1 and len(sent_d) == 1, (router, path, sent_p, sent_d)
            exchanges.append({"path": path, "client": client, "prefill": sent_p[0], "decode": sent_d[0]})
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    return {
        "router": f"{router} {PEERS[router]}",
        "command": [{p: "PREFILL_URL", d: "DECODE_URL", str(port): "PORT"}.get(c, c) for c in command],
        "prefill_answer_kv_transfer_params": PREFILL_ANSWER,
        "prefill_bootstrap": {"host": "127.0.0.1", "port": BOOTSTRAP_PORT},
        "exchanges": exchanges,
    }


def main():
    install()
    OUT.mkdir(parents=True, exist_ok=True)
    for router, flags in [("vllm-router", ["--policy", "round_robin"]),
                          ("sglang-router", ["--policy", "round_robin"])]:
        golden = capture(router, flags)
        (OUT / f"{router}.json").write_text(json.dumps(golden, indent=1) + "\n")
        print(f"wrote {OUT / (router + '.json')}: {len(golden['exchanges'])} exchanges")


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
