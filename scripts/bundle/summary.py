#!/usr/bin/env python3
"""One screen of what run.sh did: each test program and mode (passed / failed / skipped, with the
test cases of its JUnit XML), each benchmark's headline figures. Writes OUT/summary.txt and
OUT/summary.json and prints the text. Usage: summary.py OUT"""
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

out = sys.argv[1]
logs = os.path.join(out, "logs")
rows = []
with open(os.path.join(logs, "results.tsv")) as f:
    for line in f:
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 5:
            rows.append(dict(zip(["program", "mode", "status", "exit", "seconds"], parts)))


def junit_cases(path):
    """(passed, failed, skipped, names of failed cases) of a doctest JUnit file."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return None
    passed = failed = skipped = 0
    failed_names = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failed_names.append(case.get("name", "?"))
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, failed_names


def headline(name, data):
    """A few figures that say how a benchmark went."""
    keys = {
        "bench_optim": ["gpu"],
        "bench_attention": ["device", "flash_over_naive_t2048", "padded_over_packed_time", "packed_real_fraction",
                            "padded_real_fraction"],
        "pytorch_sdpa": ["device", "torch"],
        "pytorch_gemm": ["device", "torch", "rows"],
        "bench_nccl": ["device", "world", "elements"],
        "bench_layers": ["device", "dtype", "rows", "product_tflops", "copy_gbs"],
        "numerics": ["verdict", "steps", "last", "mean_loss_gap", "max_loss_gap", "val_rel_gap", "max_val_rel"],
        "ablate_gpt2": ["status", "steps", "tokens_per_s", "tflops", "mfu", "peak_tflops", "mem_peak_bytes", "final_loss", "comm_pct",
                        "host_pct"],
    }.get("ablate_gpt2" if name.startswith(("ablate_gpt2", "ablate_llama", "ablate_quickstart")) else
          "numerics" if name.startswith("numerics") else name)
    rows = data.get("rows") if isinstance(data, dict) else None
    if isinstance(rows, list) and name in ("bench_attention", "pytorch_sdpa", "bench_nccl"):
        # The table's figure per row: TF/s of forward + backward, or an all-reduce's bus bandwidth.
        picked = {k: data[k] for k in (keys or []) if k in data and not isinstance(data[k], (dict, list))}
        for row in rows[:16]:
            if not isinstance(row, dict) or row.get("status", "ok") != "ok":
                continue
            if name == "bench_nccl":
                picked[f"{row.get('op')}/{row.get('dtype')} algbw GB/s"] = row.get("algbw_gbs")
            else:
                picked[f"{row.get('shape')}/{row.get('backend')}/{row.get('dtype')} f+b TF/s"] = row.get("fwd_bwd_tflops")
        return picked
    results = data.get("results") if isinstance(data, dict) else None
    if isinstance(results, list) and name == "bench_layers":
        # Each layer's pass: measured time over the time its FLOPs and bytes predict.
        picked = {k: data[k] for k in (keys or []) if k in data}
        for row in results:
            if isinstance(row, dict) and row.get("status") == "ok":
                picked[f"{row.get('label')}/{row.get('pass')} measured/predicted"] = round(row["measured_over_predicted"], 2)
        return picked
    products = data.get("products") if isinstance(data, dict) else None
    if isinstance(products, list) and name == "pytorch_gemm":
        # The ceiling of cuda_layers' products: bf16 operands, a float32 output.
        picked = {k: data[k] for k in (keys or []) if k in data}
        for p in products:
            if isinstance(p, dict) and p.get("mode") == "bf16->f32" and p.get("tflops") is not None:
                picked[f"{p.get('product')} bf16->f32 TFLOP/s"] = round(p["tflops"], 1)
        return picked
    if isinstance(data, dict) and keys:
        picked = {k: data[k] for k in keys if k in data}
        if "gpu" in picked and isinstance(picked["gpu"], dict):
            picked = {k: v for k, v in picked["gpu"].items() if not isinstance(v, (dict, list))}
        if picked:
            return picked
    if isinstance(data, dict):
        return {k: v for k, v in list(data.items())[:6] if isinstance(v, (int, float, str))}
    return {}


def read_json(name):
    try:
        with open(os.path.join(out, f"{name}.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tokens_per_s(data):
    """tokens/s of a run's JSON: ablate's summary.json has it at the top, the peer's under "result"."""
    if not isinstance(data, dict):
        return None
    v = data.get("tokens_per_s", (data.get("result") or {}).get("tokens_per_s"))
    return v if isinstance(v, (int, float)) and v > 0 else None


def peer_of(name):
    """The PyTorch peer an ablate run compares with: pytorch_gpt for GPT-2 124M, pytorch_llama for
    configs/llama-1b.toml."""
    return "pytorch_llama" if name.startswith("ablate_llama") else "pytorch_gpt"


def ablate_rows(name, h):
    """An ablate training run's headline with what its rows hold and, beside the peer, the ratio:
    dense rows (one document of the full length a row, `_dense`) compare like with like; packed probe
    rows hold short documents, so their attention does less work than the peer's. An FP8 run
    (`_fp8`) is also set beside the peer's float8 run (torchao) and beside ablate's own bf16 run, and
    so is a run with the residual stream in bf16 (`_bf16res`); one with the classifier in FP8 too
    (`_fp8head`) beside those and beside the same run with the classifier in bf16 (`_fp8`)."""
    h = dict(h)
    h["rows"] = "dense" if "_dense" in name else "packed-probes"
    mine = h.get("tokens_per_s") if isinstance(h.get("tokens_per_s"), (int, float)) else None
    if mine is None:
        return h
    peer = tokens_per_s(read_json(peer_of(name)))
    if peer:
        h["vs_pytorch" if h["rows"] == "dense" else "vs_pytorch_unlike"] = round(mine / peer, 3)
    if "_fp8" in name:
        float8_peer = tokens_per_s(read_json(peer_of(name) + "_fp8"))
        if float8_peer and h["rows"] == "dense":
            h["vs_pytorch_float8"] = round(mine / float8_peer, 3)
    for tag in ("_fp8head", "_fp8", "_bf16res"):
        if tag in name:
            bf16 = tokens_per_s(read_json(name.replace(tag, "")))
            if bf16:
                h["vs_own_bf16"] = round(mine / bf16, 3)
            break
    if "_fp8head" in name:
        body_only = tokens_per_s(read_json(name.replace("_fp8head", "_fp8")))
        if body_only:
            h["vs_own_fp8"] = round(mine / body_only, 3)
    return h


def graph_rows(name, h):
    """A run replaying a captured step (`_graph`, run.cuda_graph) beside the same run issued call by
    call: the steps it replayed and the ratio of their tokens/s."""
    h = dict(h)
    data = read_json(name) or {}
    for k in ("captured_steps", "replayed_steps"):
        if k in data:
            h[k] = data[k]
    mine = tokens_per_s(data)
    calls = tokens_per_s(read_json(name[: -len("_graph")]))
    if mine and calls:
        h["vs_calls"] = round(mine / calls, 3)
    return h


def peer_headline(data):
    """The peer's figures (its JSON nests the measurement under "result")."""
    if not isinstance(data, dict):
        return {}
    r = data.get("result") or {}
    h = {"device": data.get("device"), "family": (data.get("model") or {}).get("family"),
         "batch_size": r.get("batch_size"), "tokens_per_s": r.get("tokens_per_s"), "step_ms": r.get("median_step_ms"),
         "mfu": r.get("mfu"), "float8": r.get("float8") or data.get("float8")}
    mem = r.get("peak_memory_bytes")
    if isinstance(mem, (int, float)):
        h["peak_memory_gib"] = round(mem / 2**30, 2)
    return {k: v for k, v in h.items() if v is not None}


lines, summary = [], {"tests": [], "benchmarks": []}
lines.append(f"{'program':<26} {'mode':<9} {'status':<8} {'cases (pass/fail/skip)':<22} seconds")
for r in rows:
    if r["mode"] not in ("memcheck", "plain", "skipped-for-time"):
        continue
    cases = junit_cases(os.path.join(logs, f"{r['program']}.{r['mode']}.xml"))
    case_text = f"{cases[0]}/{cases[1]}/{cases[2]}" if cases else "-"
    lines.append(f"{r['program']:<26} {r['mode']:<9} {r['status']:<8} {case_text:<22} {r['seconds']}")
    if cases and cases[3]:
        lines.extend(f"    failed: {n}" for n in cases[3][:5])
    summary["tests"].append({**r, "cases": list(cases[:3]) if cases else None,
                             "failed_cases": cases[3] if cases else []})
for r in rows:
    if r["mode"] not in ("benchmark", "peer"):
        continue
    path = os.path.join(out, f"{r['program']}.json")
    data = {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
    h = headline(r["program"], data)
    if r["program"].startswith(("pytorch_gpt", "pytorch_llama")) and r["mode"] == "peer":
        h = peer_headline(data)
    if r["program"].startswith(("ablate_gpt2", "ablate_llama")) and r["mode"] == "benchmark":
        h = ablate_rows(r["program"], h)
    if r["program"].endswith("_graph") and r["mode"] == "benchmark":
        h = graph_rows(r["program"], h)
    lines.append(f"{r['program']:<26} {r['mode']:<9} {r['status']:<8} " +
                 ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in h.items()))
    summary["benchmarks"].append({**r, "headline": h})
for r in rows:  # runs skipped for what the machine lacks (e.g. needs-2-gpus), named with their reason
    if r["mode"] in ("memcheck", "plain", "skipped-for-time", "benchmark", "peer"):
        continue
    lines.append(f"{r['program']:<26} {r['mode']:<9} {r['status']:<8} ({r['mode'].replace('-', ' ')})")
    summary.setdefault("not_run", []).append(r)
failed = [r for r in rows if r["status"] == "failed"]
lines.append(f"{len(rows)} runs: {sum(r['status'] == 'passed' for r in rows)} passed, {len(failed)} failed, "
             f"{sum(r['status'] == 'skipped' for r in rows)} skipped")
summary["failed"] = len(failed)
text = "\n".join(lines)
print(text)
with open(os.path.join(out, "summary.txt"), "w") as f:
    f.write(text + "\n")
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
