#!/usr/bin/env python3
"""Concurrent streaming clients against an OpenAI-compatible server: throughput and time to
first token under load, the same requests for every server measured.

    load_client.py --url http://127.0.0.1:8080 --clients 16 --requests 64 \
        --max-tokens 128 --prompt-words 100 [--system-words 0] [--seed 1] [--label NAME]
        [--json OUT.jsonl]

Each of --clients threads sends streaming `/v1/completions` requests back to back (temperature
0) until --requests have been sent in all. Request i's prompt is --prompt-words words drawn with
seed (--seed, i), so two servers get the same prompts in the same order; with --system-words N,
every prompt opens with the same N words (a shared system prompt or tool list). Time to first token is
from sending the request to the first streamed chunk that carries a choice; a request's tokens
are its final usage.completion_tokens where the server sends one (`stream_options`
include_usage), else its chunks with a choice. Throughput is all requests' tokens over the wall
time from the first request sent to the last answer finished.

Prints one line of JSON: clients, requests, failures, tokens, wall_s, tok_per_s, ttft_p50_ms,
ttft_p99_ms, and the label. Standard library only.
"""

import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no what "
    "up out who them some could other into more time these two may then do first any my now "
    "such like our over man me even most made after also did many before must through back "
    "years where much your way well down should because each just those people how too little "
    "state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since against "
    "go came right used take three"
).split()


def prompt_for(seed, index, words, system_words=0):
    shared = random.Random(seed * 7_919 - 1)
    system = " ".join(shared.choice(WORDS) for _ in range(system_words))
    rng = random.Random(seed * 1_000_003 + index)
    text = f"Request {index}: " + " ".join(rng.choice(WORDS) for _ in range(words))
    return f"{system}\n{text}" if system_words else text


def one_request(url, prompt, max_tokens, timeout):
    """(ttft seconds, tokens) of one streamed completion; raises on failure."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    body = json.dumps(
        {
            "model": "default",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft = None
    chunks = 0
    usage = None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if event.get("choices"):
            chunks += 1
            if ttft is None:
                ttft = time.perf_counter() - start
        if event.get("usage"):
            usage = event["usage"].get("completion_tokens")
    conn.close()
    if ttft is None:
        raise RuntimeError("no token streamed")
    return ttft, usage if usage else chunks


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--system-words", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="append the result line to this file too")
    args = ap.parse_args()

    lock = threading.Lock()
    next_index = [0]
    ttfts, tokens, failures = [], [], []

    def worker():
        while True:
            with lock:
                i = next_index[0]
                if i >= args.requests:
                    return
                next_index[0] += 1
            prompt = prompt_for(args.seed, i, args.prompt_words, args.system_words)
            try:
                ttft, n = one_request(args.url, prompt, args.max_tokens, args.timeout)
            except Exception as e:  # counted and shown, the run goes on
                with lock:
                    failures.append(f"request {i}: {e}")
                continue
            with lock:
                ttfts.append(ttft)
                tokens.append(n)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    result = {
        "label": args.label,
        "clients": args.clients,
        "requests": args.requests,
        "failures": len(failures),
        "tokens": sum(tokens),
        "wall_s": round(wall, 3),
        "tok_per_s": round(sum(tokens) / wall, 1) if wall > 0 else 0,
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1000, 1) if ttfts else None,
        "ttft_p99_ms": round(percentile(ttfts, 99) * 1000, 1) if ttfts else None,
    }
    for f in failures[:5]:
        print(f, file=sys.stderr)
    line = json.dumps(result)
    print(line)
    if args.json:
        with open(args.json, "a") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    main()
