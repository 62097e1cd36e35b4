#!/usr/bin/env python3
"""Check `backpack generate` against a golden.json written by make_tiny_models.py.

For every case of the golden, runs the CLI (greedy, --json) and compares the prompt token
ids with transformers' and the generated ids with transformers' greedy continuation. Tokens
are compared up to the first step whose top-2 logit margin is below --near-tie (a near-tie
may legitimately flip under a different summation order).

    python3 tests/reference/make_tiny_models.py --arch llama --out /tmp/m --hidden 96 ...
    python3 tests/reference/check_cli.py --backpack target/debug/backpack --model /tmp/m
"""

import argparse
import json
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backpack", required=True, help="path to the backpack binary")
    ap.add_argument("--model", required=True, help="model folder holding golden.json")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16"])
    ap.add_argument("--near-tie", type=float, default=1e-3)
    args = ap.parse_args()
    with open(f"{args.model}/golden.json") as f:
        golden = json.load(f)
    failures = 0
    for case in golden["cases"]:
        want = case["greedy_tokens"]
        cmd = [args.backpack, "generate", "--model", args.model, "--temperature", "0",
               "--max-tokens", str(len(want)), "--dtype", args.dtype, "--json"]
        if case["mode"] == "raw":
            cmd += ["--raw", "--prompt", case["prompt"]]
        else:
            msgs = case["messages"]
            system = [m["content"] for m in msgs if m["role"] == "system"]
            user = [m["content"] for m in msgs if m["role"] == "user"]
            if system:
                cmd += ["--system", system[0]]
            cmd += ["--prompt", user[0]]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{case['name']}: exit {out.returncode}: {out.stderr.strip()}")
            failures += 1
            continue
        got = json.loads(out.stdout.strip().splitlines()[-1])
        checked = len(want)
        for i, margin in enumerate(case["top2_margins"]):
            if margin < args.near_tie:
                checked = i
                break
        ok_prompt = got["prompt_tokens"] == case["prompt_ids"]
        ok_tokens = got["tokens"][:checked] == want[:checked]
        status = "ok" if ok_prompt and ok_tokens else "MISMATCH"
        print(f"{case['name']}: prompt ids {'equal' if ok_prompt else 'DIFFER'}, "
              f"{checked}/{len(want)} greedy tokens compared: {status}")
        if not (ok_prompt and ok_tokens):
            print(f"  want {want}\n  got  {got['tokens']}")
            failures += 1
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
