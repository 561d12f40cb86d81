#!/usr/bin/env python3
"""`make bench-real-engines`: multi-turn conversations through routers in front of three real
llama.cpp servers; TTFT per turn, the engines' own reused-token share, throughput.

    target/test-venv/bin/python scripts/bench-real-engines.py [--quick] [--out DIR]

Engines: three llama.cpp servers (PyPI xllamacpp, SmolLM2-135M; `scripts/install-test-tools`)
started by scripts/llama-server.py on loopback, 2 slots and 1 thread each, `--metrics`,
prompt caching (per slot and llama.cpp's host prompt cache), stopped by PID at the end.

Workload: conversations built from the public Mooncake trace's structure
(tests/fixtures/mooncake/first-2000.jsonl). Requests whose `hash_ids` share a leading run are
one conversation: the shared blocks become its system prompt (a long document), each request's
own blocks the user message of one turn, in trace order; the history (answers included) grows
turn by turn as a chat client's does. Every hash id block maps to the same few words
(deterministic, salted per target and round, so no target finds another's text cached). More
conversations are live than the engines have slots, and a few requests are in flight at a time,
so where a turn goes decides whether its engine still holds the prefix.

Targets, interleaved (each round runs every target once, rotated, with fresh conversations):
switchyard with the built-in `default` policy (`kv_tracking: predicted`), switchyard with a
load-only policy (fewest active requests, ties at random), client round robin over the engines,
and vllm-router `cache_aware` / `round_robin` when target/peers-venv has it
(`make bench-peers` installs it). Each router is started fresh for its turn and stopped after.

Per target: TTFT p50/p90 for turn 1 and for turns 2+ (streamed, the official OpenAI client, to
the first content token), the share of prompt tokens the engines reused (each answer's
`timings.cache_n` over `cache_n + prompt_n`), requests and output tokens per second, failed
requests. Writes bench-real-engines.csv (the table), bench-real-engines-requests.csv (every
request) and bench-real-engines.svg (the plot) into --out, and prints the table and the
issue's must-show checks. Exit status 1 when a request failed.
"""
import argparse
import csv
import hashlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[1]
TRACE = REPO / "tests" / "fixtures" / "mooncake" / "first-2000.jsonl"
MODEL_NAME = "bench"
# Words a hash id block maps to: common English, so the tokenizer spends ~1.3 tokens a word.
WORDS = (
    "yard track switch signal engine car freight train rail siding ladder hump bowl brake "
    "crew shift load route block lead main line yardmaster clerk list order crossing "
    "platform station depot coupler wheel axle bogie wagon tank hopper flat box caboose "
    "timber grain coal steel oil milk mail parcel cargo manifest schedule delay early late "
    "north south east west river valley bridge tunnel hill plain city town harbor port "
    "morning evening night winter summer spring autumn rain snow wind fog sun cloud storm "
    "red green yellow blue white black heavy light long short fast slow old new first last"
).split()


@dataclass
class Conversation:
    system: str
    questions: list


@dataclass
class Result:
    target: str
    round: int
    conversation: int
    turn: int
    ok: bool
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    worker: str = ""
    error: str = ""


@dataclass
class Target:
    name: str
    kind: str  # switchyard | client-rr | vllm-router
    policy: str = ""


@dataclass
class RunStats:
    wall_s: float
    load_before: float
    load_after: float
    results: list = field(default_factory=list)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one round, 6 conversations of 3 turns (~2 minutes)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=12, help="per target and round")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=4,
                        help="requests in flight at a time (the engines have 6 slots)")
    parser.add_argument("--words-per-block", type=int, default=5,
                        help="words one Mooncake block (512 tokens there) becomes")
    parser.add_argument("--max-tokens", type=int, default=16, help="answer length")
    parser.add_argument("--think-ms", type=int, default=1500,
                        help="most a conversation waits between an answer and its next turn")
    parser.add_argument("--bin", default=str(REPO / "target" / "release" / "switchyard"),
                        help="the switchyard binary (SWITCHYARD_BIN overrides)")
    parser.add_argument("--peers-venv", default=str(REPO / "target" / "peers-venv"))
    parser.add_argument("--out", help="where the CSVs and the plot go (docs/; --quick: "
                        "target/bench-real/)")
    args = parser.parse_args()
    args.bin = os.environ.get("SWITCHYARD_BIN", args.bin)
    if args.quick:
        args.rounds, args.conversations, args.turns = 1, 6, 3
    args.out = pathlib.Path(args.out or REPO / ("target/bench-real" if args.quick else "docs"))
    return args


# ---- workload -------------------------------------------------------------------------------

def conversation_groups(turns: int) -> list:
    """The trace's requests grouped by their shared leading blocks, each group a list of
    hash_ids lists in trace order, groups in the order their first request arrives."""
    groups = {}
    with open(TRACE, encoding="utf-8") as trace:
        for line in trace:
            ids = json.loads(line)["hash_ids"]
            groups.setdefault(ids[0], []).append(ids)
    # Prefixes of 20 to 80 blocks: long enough that a miss costs a visible prefill, short
    # enough that four turns fit one slot's context.
    return [g[:turns] for g in groups.values()
            if len(g) >= turns and 20 <= shared_blocks(g[:turns]) <= 80]


def shared_blocks(group: list) -> int:
    first, n = group[0], len(group[0])
    for ids in group[1:]:
        n = next((i for i, (a, b) in enumerate(zip(first, ids)) if a != b), min(n, len(ids)))
    return n


def block_text(salt: str, block: int, words: int) -> str:
    digest = hashlib.blake2b(f"{salt}/{block}".encode(), digest_size=words).digest()
    return " ".join(WORDS[b % len(WORDS)] for b in digest)


def conversation(group: list, salt: str, words: int) -> Conversation:
    shared = shared_blocks(group)
    document = ". ".join(block_text(salt, b, words) for b in group[0][:shared])
    system = ("You are a concise assistant for a railway yard. Answer in one short sentence. "
              f"Yard log {salt}:\n{document}.")
    questions = []
    for turn, ids in enumerate(group, 1):
        own = ". ".join(block_text(salt, b, words) for b in ids[shared:]) or "the log"
        # Each message opens with its own words (no shared "Question N:" lead-in that a
        # router matching text prefixes would take for shared history).
        questions.append(f"{own.capitalize()}: what does the log say about that (turn {turn})?")
    return Conversation(system, questions)


def workload(args, groups: list, target: Target, round_no: int) -> list:
    first = (round_no * args.conversations) % max(1, len(groups))
    picked = [groups[(first + i) % len(groups)] for i in range(args.conversations)]
    salt = f"{target.name}-r{round_no}"
    return [conversation(g, f"{salt}-c{i}", args.words_per_block) for i, g in enumerate(picked)]


# ---- processes ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} was not ready within {seconds:.0f} s")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_engines(logs: pathlib.Path) -> tuple:
    processes, urls = [], []
    for n in range(3):
        port = free_port()
        with open(logs / f"engine-{n + 1}.log", "w", encoding="utf-8") as log:
            processes.append(subprocess.Popen(
                [sys.executable, str(REPO / "scripts" / "llama-server.py"), "--port",
                 str(port), "--alias", MODEL_NAME, "--slots", "2", "--threads", "1",
                 "--verbosity", "0"], stdout=log, stderr=subprocess.STDOUT))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_until(lambda u=url: answers(f"{u}/health"), 90, f"llama.cpp at {url}")
    return processes, urls


SWITCHYARD_POLICIES = {
    # The built-in policy: prefix overlap (predicted from what the router sent) and load.
    "default": "worker_selection:\n  default: default\n",
    # Load only: fewest active requests, ties at random; no prefix knowledge.
    "load-only": (
        "worker_selection:\n  default: load-only\n  instances:\n    - name: load-only\n"
        "      scorers: [{type: builtin.active-requests}]\n"
        "      picker: {type: builtin.lowest-cost, parameters: {tie_break: random}}\n"),
}


def switchyard_config(policy: str, engines: list) -> str:
    workers = "".join(f'  - {{model: {MODEL_NAME}, worker_id: {i + 1}, url: "{url}"}}\n'
                      for i, url in enumerate(engines))
    return (f"plugins: []\n{SWITCHYARD_POLICIES[policy]}"
            f"models:\n  {MODEL_NAME}: {{kv_tracking: predicted}}   # llama.cpp publishes no "
            "KV events\nengine_metrics: {interval_ms: 500}\n"
            f"workers:\n{workers}")


def start_router(args, target: Target, engines: list, logs: pathlib.Path):
    port, stem = free_port(), target.name.replace(" ", "-")
    if target.kind == "switchyard":
        config = logs / f"{stem}.yaml"
        config.write_text(switchyard_config(target.policy, engines), encoding="utf-8")
        command = [args.bin, "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
        ready = lambda: answers(f"http://127.0.0.1:{port}/readyz")  # noqa: E731
    else:
        command = [str(pathlib.Path(args.peers_venv) / "bin" / "vllm-router"), "--worker-urls",
                   *engines, "--policy", target.policy, "--host", "127.0.0.1", "--port",
                   str(port), "--prometheus-port", str(free_port()), "--log-level", "error"]
        ready = lambda: listens(port)  # noqa: E731
    with open(logs / f"{stem}.log", "a", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    wait_until(ready, 60, target.name)
    return process, f"http://127.0.0.1:{port}"


# ---- the client -----------------------------------------------------------------------------

class Clients:
    """One OpenAI client per base URL; `pick` is the URL a request goes to (round robin over
    the engines for the client-side target, else the router)."""

    def __init__(self, urls: list):
        from openai import OpenAI

        self.clients = [OpenAI(base_url=f"{u}/v1", api_key="unused", max_retries=0,
                               timeout=300) for u in urls]
        self.next, self.lock = 0, threading.Lock()

    def pick(self):
        with self.lock:
            n, self.next = self.next, self.next + 1
        return n % len(self.clients), self.clients[n % len(self.clients)]


def one_turn(clients: Clients, messages: list, max_tokens: int, record: Result) -> str:
    index, client = clients.pick()
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=messages, stream=True, max_tokens=max_tokens, temperature=0,
        stream_options={"include_usage": True})
    record.worker = raw.headers.get("x-switchyard-worker", str(index + 1)
                                    if len(clients.clients) > 1 else "")
    answer, first = "", None
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.monotonic()
            answer += chunk.choices[0].delta.content
        timings = (chunk.model_extra or {}).get("timings")
        if timings:
            record.cached_tokens = timings["cache_n"]
            record.prompt_tokens = timings["cache_n"] + timings["prompt_n"]
            record.output_tokens = timings["predicted_n"]
    done = time.monotonic()
    record.ttft_ms = ((first or done) - started) * 1000
    record.total_ms = (done - started) * 1000
    record.ok = first is not None and record.prompt_tokens > 0
    if not record.ok:
        record.error = "no content or no timings in the stream"
    return answer


def run_conversation(args, clients, gate, talk: Conversation, tag: tuple, out: list) -> None:
    target, round_no, number = tag
    messages = [{"role": "system", "content": talk.system}]
    time.sleep(number * 0.3)  # staggered starts
    for turn, question in enumerate(talk.questions, 1):
        messages.append({"role": "user", "content": question})
        record = Result(target, round_no, number, turn, ok=False)
        with gate:
            try:
                answer = one_turn(clients, messages, args.max_tokens, record)
            except Exception as error:  # any failure is counted and reported, not retried
                record.error = f"{type(error).__name__}: {error}"[:300]
                answer = ""
        out.append(record)
        if not record.ok:
            return  # the conversation cannot go on without its answer
        messages.append({"role": "assistant", "content": answer})
        # Deterministic think time, so every target sees the same arrival pattern.
        spread = int.from_bytes(hashlib.blake2b(f"{number}/{turn}".encode(),
                                                digest_size=2).digest(), "big") / 65535
        time.sleep(spread * args.think_ms / 1000)


def run_target(args, target: Target, urls: list, talks: list, round_no: int) -> RunStats:
    clients, gate, results = Clients(urls), threading.BoundedSemaphore(args.in_flight), []
    threads = [threading.Thread(target=run_conversation,
                                args=(args, clients, gate, talk, (target.name, round_no, i),
                                      results))
               for i, talk in enumerate(talks)]
    load_before, started = os.getloadavg()[0], time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return RunStats(time.monotonic() - started, load_before, os.getloadavg()[0], results)


# ---- results --------------------------------------------------------------------------------

def quantile(values: list, q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(name: str, runs: list) -> dict:
    results = [r for run in runs for r in run.results]
    good = [r for r in results if r.ok]
    first = [r.ttft_ms for r in good if r.turn == 1]
    later = [r for r in good if r.turn > 1]
    wall = sum(run.wall_s for run in runs)
    previous = {(r.round, r.conversation, r.turn): r.worker for r in good}
    moves = [r.worker == previous.get((r.round, r.conversation, r.turn - 1)) for r in later
             if r.worker and previous.get((r.round, r.conversation, r.turn - 1))]
    def share(rs: list) -> float:
        return sum(r.cached_tokens for r in rs) / max(1, sum(r.prompt_tokens for r in rs))

    return {
        "target": name, "requests": len(results), "failed": len(results) - len(good),
        "ttft_turn1_p50_ms": quantile(first, 0.5), "ttft_turn1_p90_ms": quantile(first, 0.9),
        "ttft_turns2plus_p50_ms": quantile([r.ttft_ms for r in later], 0.5),
        "ttft_turns2plus_p90_ms": quantile([r.ttft_ms for r in later], 0.9),
        "reused_share": share(good), "reused_share_turns2plus": share(later),
        "requests_per_s": len(good) / wall, "output_tokens_per_s":
            sum(r.output_tokens for r in good) / wall,
        "stayed_share": sum(moves) / len(moves) if moves else float("nan"),
        "wall_s": wall, "load_avg_1m": sum(run.load_after for run in runs) / len(runs),
    }


def write_csvs(out: pathlib.Path, table: list, results: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "bench-real-engines.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        for row in table:
            writer.writerow({k: round(v, 3) if isinstance(v, float) else v
                             for k, v in row.items()})
    with open(out / "bench-real-engines-requests.csv", "w", newline="", encoding="utf-8") as f:
        names = list(Result.__dataclass_fields__)
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for r in results:
            writer.writerow({k: round(v, 1) if isinstance(v, float) else v
                             for k, v in r.__dict__.items()})


def svg_plot(table: list, title: str) -> str:
    """Bars of TTFT p50 and p90 (turn 1, turns 2+) per target, the reused share beside."""
    series = [("ttft_turn1_p50_ms", "turn 1 p50", "#9ecae1"),
              ("ttft_turn1_p90_ms", "turn 1 p90", "#3182bd"),
              ("ttft_turns2plus_p50_ms", "turns 2+ p50", "#fdae6b"),
              ("ttft_turns2plus_p90_ms", "turns 2+ p90", "#e6550d")]
    top = max(max(row[k] for k, _, _ in series) for row in table) * 1.1
    width, height, left, bottom, group = 860, 440, 70, 340, 150
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="20" font-size="14">{title}</text>']
    for tick in range(0, int(top) + 1, max(500, int(top / 6) // 500 * 500 or 500)):
        y = bottom - tick / top * 280
        parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick}</text>')
    parts.append(f'<text x="16" y="200" transform="rotate(-90 16 200)">TTFT, ms</text>')
    for i, row in enumerate(table):
        x0 = left + 15 + i * group
        for j, (key, _, colour) in enumerate(series):
            h = row[key] / top * 280
            parts.append(f'<rect x="{x0 + j * 28}" y="{bottom - h:.1f}" width="24" '
                         f'height="{h:.1f}" fill="{colour}"/>')
        router, _, policy = row["target"].partition(" ")
        reused = f"reused {row['reused_share_turns2plus']:.0%} (turns 2+)"
        for line, text in enumerate((router, policy, reused)):
            parts.append(f'<text x="{x0 + 54}" y="{bottom + 16 + 15 * line}" '
                         f'text-anchor="middle">{text}</text>')
    for j, (_, label, colour) in enumerate(series):
        parts.append(f'<rect x="{left + j * 130}" y="{height - 22}" width="12" height="12" '
                     f'fill="{colour}"/><text x="{left + 16 + j * 130}" y="{height - 12}">'
                     f'{label}</text>')
    return "\n".join(parts + ["</svg>\n"])


def markdown(table: list) -> str:
    lines = ["| target | TTFT turn 1 p50 / p90 | TTFT turns 2+ p50 / p90 | reused tokens "
             "(all / turns 2+) | turns 2+ on the previous turn's engine | requests/s | "
             "output tok/s | load | failed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        stayed = "?" if r["stayed_share"] != r["stayed_share"] else f"{r['stayed_share']:.0%}"
        lines.append(
            f"| {r['target']} | {r['ttft_turn1_p50_ms']:,.0f} / {r['ttft_turn1_p90_ms']:,.0f} ms"
            f" | {r['ttft_turns2plus_p50_ms']:,.0f} / {r['ttft_turns2plus_p90_ms']:,.0f} ms | "
            f"{r['reused_share'] * 100:.0f}% / {r['reused_share_turns2plus'] * 100:.0f}% | "
            f"{stayed} | "
            f"{r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.1f} | "
            f"{r['load_avg_1m']:.1f} | {r['failed']} of {r['requests']} |")
    return "\n".join(lines)


def must_show(table: list) -> list:
    rows = {r["target"]: r for r in table}
    ours = rows.get("switchyard default")
    rr = rows.get("client round robin")
    if not ours or not rr:
        return ["must-show: not measured (switchyard default or client round robin missing)"]
    p50 = "ttft_turns2plus_p50_ms"
    checks = [(f"switchyard default TTFT p50 turns 2+ <= 0.5x client round robin "
               f"({ours[p50]:.0f} vs {rr[p50]:.0f} ms, ratio {ours[p50] / rr[p50]:.2f})",
               ours[p50] <= 0.5 * rr[p50])]
    for name, row in rows.items():
        if name == "switchyard default":
            continue
        for key, label in ((p50, "p50"), ("ttft_turns2plus_p90_ms", "p90")):
            checks.append((f"switchyard default TTFT {label} turns 2+ no worse than {name} "
                           f"({ours[key]:.0f} vs {row[key]:.0f} ms)", ours[key] <= row[key]))
    # Turn 1 of a fresh conversation has nothing to reuse anywhere, so the share over all
    # turns cannot pass (turns - 1) / turns; the check reads turns 2+.
    checks.append((f"switchyard default reused-token share turns 2+ >= 80% "
                   f"({ours['reused_share_turns2plus'] * 100:.1f}%; all turns "
                   f"{ours['reused_share'] * 100:.1f}%)", ours["reused_share_turns2plus"] >= 0.8))
    checks.append(("0 failed requests in every target",
                   all(r["failed"] == 0 for r in table)))
    return [f"must-show: {'yes' if ok else 'NO '}  {text}" for text, ok in checks]


# ---- main -----------------------------------------------------------------------------------

def targets(args) -> list:
    chosen = [Target("switchyard default", "switchyard", "default"),
              Target("switchyard load-only", "switchyard", "load-only"),
              Target("client round robin", "client-rr")]
    if (pathlib.Path(args.peers_venv) / "bin" / "vllm-router").exists():
        chosen += [Target("vllm-router cache_aware", "vllm-router", "cache_aware"),
                   Target("vllm-router round_robin", "vllm-router", "round_robin")]
    else:
        print(f"vllm-router is not in {args.peers_venv} (make bench-peers installs it): "
              "skipped", file=sys.stderr)
    return chosen


def preflight(args) -> str:
    try:
        import openai  # noqa: F401
        import xllamacpp  # noqa: F401
    except ImportError as missing:
        return (f"missing in {sys.executable}: {missing.name}; run scripts/install-test-tools "
                "and start this with target/test-venv/bin/python")
    if not os.access(args.bin, os.X_OK):
        return f"no switchyard binary at {args.bin}; cargo build --release -p switchyard"
    return ""


def run_rounds(args, engines: list, logs: pathlib.Path) -> dict:
    groups, chosen, runs = conversation_groups(args.turns), targets(args), {}
    for round_no in range(args.rounds):
        order = chosen[round_no % len(chosen):] + chosen[:round_no % len(chosen)]
        for target in order:
            talks = workload(args, groups, target, round_no)
            router = None
            if target.kind == "client-rr":
                urls = engines
            else:
                router, url = start_router(args, target, engines, logs)
                urls = [url]
            try:
                stats = run_target(args, target, urls, talks, round_no)
            finally:
                if router:
                    stop(router)
            runs.setdefault(target.name, []).append(stats)
            row = summarize(target.name, [stats])
            print(f"round {round_no + 1} {target.name:24} turns 2+ TTFT p50 "
                  f"{row['ttft_turns2plus_p50_ms']:6.0f} ms, reused "
                  f"{row['reused_share_turns2plus']:4.0%} (turns 2+), {row['failed']} failed, "
                  f"{stats.wall_s:5.1f} s, load {stats.load_after:.1f}", flush=True)
    return runs


def main() -> int:
    args = arguments()
    problem = preflight(args)
    if problem:
        print(f"bench-real-engines: {problem}", file=sys.stderr)
        return 2
    logs = REPO / "target" / "bench-real" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"switchyard: {args.bin}; {args.rounds} round(s) of {args.conversations} "
          f"conversations x {args.turns} turns, {args.in_flight} in flight, 3 engines x 2 "
          f"slots; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    processes, engines = start_engines(logs)
    try:
        runs = run_rounds(args, engines, logs)
    finally:
        for process in processes:
            stop(process)
    table = [summarize(name, stats) for name, stats in runs.items()]
    write_csvs(args.out, table, [r for stats in runs.values() for s in stats for r in s.results])
    title = (f"Real llama.cpp engines (3 x 2 slots): {args.rounds} round(s) x "
             f"{args.conversations} conversations x {args.turns} turns per target")
    (args.out / "bench-real-engines.svg").write_text(svg_plot(table, title), encoding="utf-8")
    print(markdown(table))
    print("\n".join(must_show(table)))
    failures = [r for stats in runs.values() for s in stats for r in s.results if not r.ok]
    for r in failures[:10]:
        print(f"failed: {r.target} round {r.round} conversation {r.conversation} turn "
              f"{r.turn}: {r.error}", file=sys.stderr)
    print(f"wrote {args.out}/bench-real-engines.csv, -requests.csv and .svg")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
