#!/usr/bin/env python3
"""Soak test of a batching server: many streamed requests, some cancelled by disconnecting,
every completed answer checked against the same request answered alone.

    soak_client.py --url http://127.0.0.1:8080 --pid SERVER_PID --requests 10000 \
        --clients 32 --prompts 64 --max-tokens 24 [--cancel 0.2] [--seed 1] [--json OUT]

First each of --prompts prompts is answered alone (one request at a time, temperature 0): the
references. Then --clients threads send --requests requests drawn from those prompts. With
chance --cancel a request is cut: the client reads a random number of chunks (0 to the answer's
length) and closes the connection, which the server takes as a cancellation; the others read
to the end and their text must equal the prompt's reference. The server's resident memory
(/proc/PID/status VmRSS) and its GPU memory (nvidia-smi, where present) are sampled before,
every 10 % of the way and after. Last, --clients requests at once must all complete (no slot
left taken by a cancelled request).

Prints one line of JSON: requests, completed, cancelled, mismatches (with the first few
prompts that differed), failures, rss_mib and gpu_mib samples, and wall_s. Standard library
only.
"""

import argparse
import http.client
import json
import random
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from load_client import prompt_for  # noqa: E402


def stream(url, prompt, max_tokens, cut_after=None, timeout=300):
    """The streamed text of a completion; None when cut after `cut_after` chunks."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    body = json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    )
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    text, chunks = [], 0
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        for choice in event.get("choices", []):
            text.append(choice.get("text", ""))
            chunks += 1
        if cut_after is not None and chunks >= cut_after:
            conn.close()
            return None
    conn.close()
    return "".join(text)


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def gpu_mib(pid):
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return int(fields[1])
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--cancel", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()

    prompts = [prompt_for(args.seed, i, args.prompt_words) for i in range(args.prompts)]
    start = time.perf_counter()
    reference = [stream(args.url, p, args.max_tokens) for p in prompts]
    samples = [(0, rss_mib(args.pid), gpu_mib(args.pid))]

    lock = threading.Lock()
    state = {"next": 0, "completed": 0, "cancelled": 0, "failures": [], "mismatches": []}
    rng_lock = threading.Lock()
    rng = random.Random(args.seed)

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= args.requests:
                    return
                state["next"] += 1
                if i % max(1, args.requests // 10) == 0 and i > 0:
                    samples.append((i, rss_mib(args.pid), gpu_mib(args.pid)))
            with rng_lock:
                which = rng.randrange(len(prompts))
                cut = rng.randrange(args.max_tokens + 1) if rng.random() < args.cancel else None
            try:
                text = stream(args.url, prompts[which], args.max_tokens, cut)
            except Exception as e:  # counted, the soak goes on
                with lock:
                    state["failures"].append(f"request {i}: {e}")
                continue
            with lock:
                if text is None:
                    state["cancelled"] += 1
                else:
                    state["completed"] += 1
                    if text != reference[which]:
                        state["mismatches"].append(which)

    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every slot free again: as many requests as clients at once, all answered.
    time.sleep(1)
    final = [None] * args.clients

    def last(k):
        try:
            final[k] = stream(args.url, prompts[k % len(prompts)], args.max_tokens, timeout=120)
        except Exception as e:
            final[k] = f"error: {e}"

    ts = [threading.Thread(target=last, args=(k,)) for k in range(args.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
        answered = sum(1 for f in final if f is not None and not f.startswith("error: "))
    differing_after = sorted(
        {k % len(prompts) for k, f in enumerate(final) if f != reference[k % len(prompts)]}
    )
    samples.append((args.requests, rss_mib(args.pid), gpu_mib(args.pid)))
    result = {
        "requests": args.requests,
        "completed": state["completed"],
        "cancelled": state["cancelled"],
        "mismatches": len(state["mismatches"]),
        "mismatched_prompts": sorted(set(state["mismatches"]))[:10],
        "failures": len(state["failures"]),
                "after_soak_answered": answered,
        "after_soak_of": args.clients,
        "after_soak_differing_prompts": differing_after,
        "rss_mib": [s[1] for s in samples],
        "gpu_mib": [s[2] for s in samples],
        "wall_s": round(time.perf_counter() - start, 1),
    }
    for f in state["failures"][:5]:
        print(f, file=sys.stderr)
    line = json.dumps(result)
    print(line)
    if args.json:
        with open(args.json, "a") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    main()
