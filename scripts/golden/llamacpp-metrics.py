#!/usr/bin/env python3
"""Writes tests/fixtures/engine_metrics/llamacpp.txt: a real llama.cpp server's `/metrics`
scraped under load.

One llama.cpp server (scripts/llama-server.py: one slot, one thread) is sent three
streamed completions at once; its `/metrics` is scraped while one is being processed and
the other two wait (`llamacpp:requests_processing 1`, `llamacpp:requests_deferred 2`),
after an earlier request so the counters are not all zero.

    scripts/install-test-tools
    target/test-venv/bin/python scripts/golden/llamacpp-metrics.py
"""
import json
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "fixtures" / "engine_metrics" / "llamacpp.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(url: str, prompt: str, max_tokens: int) -> None:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return response.read().decode()


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0


def main() -> int:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "llama-server.py"), "--port", str(port),
         "--slots", "1"], stdout=subprocess.PIPE, text=True)
    try:
        ready = server.stdout.readline()
        if "listening on" not in ready:
            print(f"the server did not start: {ready!r}", file=sys.stderr)
            return 1
        url = ready.split()[-1]
        complete(url, "The capital of France is", 8)
        load = [threading.Thread(target=complete, args=(url, f"Count to {n}:", 96))
                for n in (10, 20, 30)]
        for thread in load:
            thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = scrape(url)
            if gauge(text, "llamacpp:requests_deferred") == 2:
                OUT.write_text(text)
                print(f"wrote {OUT}")
                break
            time.sleep(0.02)
        else:
            print("never saw two requests deferred", file=sys.stderr)
            return 1
        for thread in load:
            thread.join()
        return 0
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
