#!/usr/bin/env python3
"""Starts one llama.cpp server (PyPI xllamacpp: llama.cpp's own HTTP server, run in this
process) on a loopback port, for the real-engine tests, the demo and the benchmarks.

    target/test-venv/bin/python scripts/llama-server.py --port 8001 [--slots 2]

`scripts/install-test-tools` installs xllamacpp into target/test-venv and the model into
target/models/. Once `/health` answers it prints one line on stdout,

    llama-server listening on http://127.0.0.1:PORT

and serves until it is killed (SIGTERM or SIGKILL, by PID) or its parent dies (Linux:
PR_SET_PDEATHSIG), so a test that stops early leaves no engine behind. `/metrics` and
`/slots` are on; the model is served under the name `--alias`. llama.cpp's HTTP server
closes a keep-alive connection idle for 5 s (cpp-httplib's default).
"""
import argparse
import ctypes
import os
import pathlib
import signal
import sys
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
MODEL = REPO / "target" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """The kernel sends SIGKILL to this process when the one that started it ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent was gone before prctl took effect
        os._exit(1)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default=str(MODEL))
    parser.add_argument("--alias", default="smollm2")
    parser.add_argument("--slots", type=int, default=2, help="parallel sequences (-np)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ctx", type=int, default=4096, help="context, shared by the slots")
    parser.add_argument("--cache-ram-mib", type=int, default=256,
                        help="llama.cpp's host prompt cache")
    parser.add_argument("--verbosity", type=int, default=1)
    parser.add_argument("--detach", action="store_true",
                        help="keep serving when the process that started it ends")
    return parser.parse_args()


def params(args: argparse.Namespace):
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = args.model
    p.model_alias = {args.alias}
    p.hostnames = [args.host]
    p.port = args.port
    p.n_parallel = args.slots
    p.n_ctx = args.ctx
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.cache_ram_mib = args.cache_ram_mib
    p.verbosity = args.verbosity
    return p


def wait_healthy(url: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def main() -> int:
    args = arguments()
    if not args.detach:
        die_with_parent()
    if not pathlib.Path(args.model).is_file():
        print(f"llama-server: no model at {args.model}; run scripts/install-test-tools",
              file=sys.stderr)
        return 2
    try:
        import xllamacpp
    except ImportError:
        print("llama-server: no xllamacpp in this Python; run scripts/install-test-tools and "
              "start this with target/test-venv/bin/python", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server = xllamacpp.Server(params(args))
    url = f"http://{args.host}:{args.port}"
    if not wait_healthy(url, time.monotonic() + 60):
        print(f"llama-server: {url}/health did not answer within 60 s", file=sys.stderr)
        return 1
    print(f"llama-server listening on {url}", flush=True)
    # `server` stays referenced (serving) until the process is killed.
    while server is not None:
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
