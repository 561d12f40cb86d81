"""A bounded connection flood for tests/connection_flood.rs, loopback only.

Opens COUNT connections from each of SOURCES loopback addresses (127.0.0.FIRST ...) to
HOST:PORT and holds them for SECONDS: `idle` ones send nothing, `slowloris` ones trickle a
request head one byte a second and never finish it. Then closes everything and prints a
JSON summary: opened, refused (connect failed), closed_by_server (seen while holding).
Once every connection is attempted it prints a first line, `{"built_up": OPENED}`.
"""
import json
import resource
import socket
import sys
import time

host, port, first, sources, count, seconds, mode = sys.argv[1:8]
port, first, sources, count, seconds = int(port), int(first), int(sources), int(count), float(seconds)
# Hold as many sockets as the hard limit allows (the soft one may be lower).
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
head = b"GET /healthz HTTP/1.1\r\nhost: flood\r\nx-slow: " + b"a" * 4096

held, opened, refused, closed = [], 0, 0, 0
deadline = time.monotonic() + seconds
for source in range(first, first + sources):
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            refused += 1  # out of descriptors here: counted, not held
            continue
        s.settimeout(2.0)
        try:
            s.bind((f"127.0.0.{source}", 0))
            s.connect((host, port))
            opened += 1
            held.append([s, 0])
        except OSError:
            refused += 1
            s.close()

# Every connection is open (or refused): the flood is built up; the test probes from now.
print(json.dumps({"built_up": opened}), flush=True)

while time.monotonic() < deadline:
    alive = []
    for entry in held:
        s, sent = entry
        try:
            if mode == "slowloris":
                s.send(head[sent % len(head):sent % len(head) + 1])
                entry[1] += 1
            else:
                s.setblocking(False)
                try:
                    if s.recv(1, socket.MSG_PEEK) == b"":
                        raise ConnectionResetError()
                except BlockingIOError:
                    pass
            alive.append(entry)
        except OSError:
            closed += 1
            s.close()
    held = alive
    time.sleep(1.0)

for s, _ in held:
    s.close()
print(json.dumps({"mode": mode, "opened": opened, "refused": refused, "closed_by_server": closed}))
