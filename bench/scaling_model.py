#!/usr/bin/env python3
"""The scaling model of docs/distributed.md ("Scaling model: communication at 2, 8 and 64 GPUs"):
per-step communication and data-parallel efficiency of GPT-2 124M and a 1.03B Llama-style model on
H100s, from alpha-beta costs of NCCL's ring and ablate's own gradient-bucket plan. Nothing here is
measured: it prints the tables the document gives (and, with --json FILE, every cell).

Usage: python3 bench/scaling_model.py [--bucket-mb 25] [--json FILE]

The bucket plan is ablate's (core/src/buckets.cpp, [run] bucket_mb = 25, f32 gradients): the flat
buffer, parameters in forward order, cut from its end in pieces of 6,250,000 elements; a bucket is
ready after the last gradient write that touches it (core/src/model_schedule.cpp: the classifier's
write first, then each site with parameters in reverse). The backward pass's clock is FLOP-
proportional: a linear site costs 2 x its weights per token forward and 4 x backward, attention
2 d T forward and 4 d T backward per layer, the classifier's forward and backward both come before
the first write; norms, embeddings and positions cost nothing. The buckets run one after another on
the communicator's stream, each when it is ready and the previous one is done; what runs past the
end of the backward pass is exposed.
"""
import argparse
import json
import math

# --- the machine (docs/distributed.md says which figure comes from where) ---------------------------
GPUS_PER_NODE = 8
NVLINK_BUS = 360e9        # ring bus bandwidth within a node, B/s (NVLink 4: 450 GB/s line, ~370 effective)
NET_BUS = 8 * 45e9        # ring bus bandwidth across nodes: the node's 8 x 400 Gb/s NICs at ~45 GB/s each
NET_BUS_ONE_NIC = 45e9    # sensitivity: every rank's whole ring traffic through its own NIC
BASE = 8.4e-6             # NCCL tuning.cc, Ring/Simple base latency per collective
HOP_NVL = 3.4e-6          # NCCL tuning.cc, Ring/Simple, NVLink hop
HOP_NET = 14.0e-6         # NCCL tuning.cc, Ring/Simple, network hop
TREE_HOP_NVL = 4.0e-6     # NCCL tuning.cc, Tree/Simple, NVLink hop
H100_BF16_DENSE = 989e12
BUCKET_BYTES = 25e6


# --- the two models -------------------------------------------------------------------------------
def gpt2_124m():
    d, L, V, T = 768, 12, 50304, 1024
    sites = [("wte", V * d, 0, 0), ("wpe", T * d, 0, 0)]  # (name, parameters, fwd flops/token, bwd flops/token)
    for l in range(L):
        sites += [(f"{l}.ln1", 2 * d, 0, 0)]
        sites += [(f"{l}.{x}", d * d + d, 2 * d * d, 4 * d * d) for x in "qkv"]
        sites += [(f"{l}.attention", 0, 2 * d * T, 4 * d * T), (f"{l}.o", d * d + d, 2 * d * d, 4 * d * d)]
        sites += [(f"{l}.ln2", 2 * d, 0, 0), (f"{l}.mlp", 8 * d * d + 5 * d, 16 * d * d, 32 * d * d)]
    sites += [("ln_f", 2 * d, 0, 0)]
    return {"name": "GPT-2 124M", "sites": sites, "head": ("tied", V * d), "d": d, "L": L, "T": T}


def llama_1b():
    d, L, V, T, h = 2048, 16, 50304, 2048, 5632
    sites = [("wte", V * d, 0, 0)]
    for l in range(L):
        sites += [(f"{l}.ln1", d, 0, 0)]
        sites += [(f"{l}.{x}", d * d, 2 * d * d, 4 * d * d) for x in "qkv"]
        sites += [(f"{l}.attention", 0, 2 * d * T, 4 * d * T), (f"{l}.o", d * d, 2 * d * d, 4 * d * d)]
        sites += [(f"{l}.ln2", d, 0, 0), (f"{l}.mlp", 3 * d * h, 6 * d * h, 12 * d * h)]
    sites += [("ln_f", d, 0, 0), ("lm_head", V * d, 0, 0)]
    return {"name": "Llama-style 1.03B", "sites": sites, "head": ("untied", V * d), "d": d, "L": L, "T": T}


def layout(model):
    """Offsets, the gradient writes in backward order with the time (fraction of compute) each ends."""
    offs, at = [], 0
    for name, n, _, _ in model["sites"]:
        offs.append((name, at, at + n))
        at += n
    total = at
    kind, head_n = model["head"]
    head_range = (0, head_n) if kind == "tied" else (total - head_n, total)
    flops_f = sum(f for _, _, f, _ in model["sites"])
    flops_b = sum(b for _, _, _, b in model["sites"])
    head_f, head_b = 2 * head_n, 4 * head_n
    all_flops = flops_f + flops_b + head_f + head_b
    clock = flops_f + head_f + head_b  # the classifier's write comes with the loss
    writes = [(head_range, clock / all_flops)]
    for (name, n, _, b), (_, lo, hi) in reversed(list(zip(model["sites"], offs))):
        clock += b
        if n > 0 and name != "lm_head":
            writes.append(((lo, hi), clock / all_flops))
    return total, writes, all_flops


def plan_buckets(total, writes, elements):
    out = []
    end = total
    while end > 0:
        lo = max(0, end - elements)
        ready = max((i for i, ((a, b), _) in enumerate(writes) if a < end and lo < b), default=len(writes) - 1)
        out.append((lo, end, ready))
        end -= elements
    out.sort(key=lambda b: b[2])  # stable: ties keep the bucket nearer the end first
    return out


def shard_of(numel, world, rank):
    q, r = divmod(numel, world)
    return (rank * q + min(rank, r), q + (1 if rank < r else 0))


# --- alpha-beta costs -----------------------------------------------------------------------------
def net(p, one_nic=False):
    nodes = max(1, p // GPUS_PER_NODE)
    bw = NVLINK_BUS if nodes == 1 else min(NVLINK_BUS, NET_BUS_ONE_NIC if one_nic else NET_BUS)
    return nodes, bw


def ring_latency(p, steps_per_rank):
    """steps_per_rank: 2 for all-reduce, 1 for reduce-scatter, all-gather, reduce."""
    nodes, _ = net(p)
    inter = steps_per_rank * (nodes - 1)
    return BASE + (steps_per_rank * (p - 1) - inter) * HOP_NVL + inter * HOP_NET


def tree_allreduce_latency(p):
    nodes, _ = net(p)
    return BASE + 2 * ((min(p, GPUS_PER_NODE) - 1) * TREE_HOP_NVL + math.log2(nodes) * HOP_NET)


def all_reduce(p, nbytes, one_nic=False, tree_latency=False):
    """Ring; tree_latency: the ring's bandwidth with the tree's latency where that is lower (the
    optimistic bound of NCCL picking its tree for latency-bound sizes)."""
    _, bw = net(p, one_nic)
    lat = min(ring_latency(p, 2), tree_allreduce_latency(p)) if tree_latency else ring_latency(p, 2)
    return lat + 2 * (p - 1) / p * nbytes / bw


def half(p, nbytes, one_nic=False):  # reduce-scatter or all-gather of a buffer of nbytes
    _, bw = net(p, one_nic)
    return ring_latency(p, 1) + (p - 1) / p * nbytes / bw


def reduce_to_root(p, nbytes, one_nic=False):  # ring reduce: every link carries the piece once
    _, bw = net(p, one_nic)
    return ring_latency(p, 1) + nbytes / bw


def scalars(p):  # count_targets and the loss sum (ZeRO-1: loss sum and squared norm): two small all-reduces
    return 2 * min(ring_latency(p, 2), tree_allreduce_latency(p))


# --- one step -------------------------------------------------------------------------------------
def step(model, p, compute_s, dtype_bytes=4, zero1=False, overlap=True, one_nic=False, tree_latency=False):
    total, writes, _ = layout(model)
    nbytes = total * dtype_bytes
    res = {"bytes": nbytes}
    if not overlap:  # bucket_mb = 0: one reduction after the backward pass
        if zero1:
            grad = half(p, nbytes, one_nic)
        else:
            grad = all_reduce(p, nbytes, one_nic, tree_latency)
        buckets = 1
        exposed_grad = grad
    else:
        elements = int(BUCKET_BYTES / 4)  # buckets are cut in f32 elements ([run] bucket_mb / 4 bytes)
        plan = plan_buckets(total, writes, elements)
        buckets = len(plan)
        free, grad = 0.0, 0.0
        bwd_end = compute_s * 1.0
        for lo, hi, ready in plan:
            b = (hi - lo) * dtype_bytes
            if zero1:
                cost = 0.0
                for r in range(p):
                    s0, sn = shard_of(total, p, r)
                    a, z = max(lo, s0), min(hi, s0 + sn)
                    if a < z:
                        cost += reduce_to_root(p, (z - a) * dtype_bytes, one_nic)
            else:
                cost = all_reduce(p, b, one_nic, tree_latency)
            grad += cost
            start = max(writes[ready][1] * compute_s, free)
            free = start + cost
        exposed_grad = max(0.0, free - bwd_end)
    gather = half(p, total * 4, one_nic) if zero1 else 0.0  # the f32 parameters, after the optimizer
    sc = scalars(p)
    res.update(buckets=buckets, grad_comm_s=grad, gather_s=gather, scalars_s=sc, comm_s=grad + gather + sc,
               exposed_s=exposed_grad + gather + sc)
    res["efficiency"] = compute_s / (compute_s + res["exposed_s"])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="[run] bucket_mb (default 25)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    global BUCKET_BYTES
    BUCKET_BYTES = args.bucket_mb * 1e6

    g, m = gpt2_124m(), llama_1b()
    n_g, n_m = layout(g)[0], layout(m)[0]
    tokens_m = 8 * 2048
    compute_m = 6 * n_m * tokens_m / (0.40 * H100_BF16_DENSE)
    cases = [
        ("GPT-2, ablate", g, 65536 / 268285.3),      # H100, 64 x 1024 a GPU: 268.3k tokens/s measured
        ("GPT-2, PyTorch peer", g, 0.1401878),       # the same, PyTorch's measured median step
        ("1B, 6N at 40% MFU", m, compute_m),         # 8 x 2048 a GPU
    ]
    print(f"parameters: GPT-2 {n_g:,}, Llama-style {n_m:,}")
    for model, n in ((g, n_g), (m, n_m)):
        total, writes, _ = layout(model)
        plan = plan_buckets(total, writes, int(BUCKET_BYTES / 4))
        last = [b for b in plan if b[2] == len(writes) - 1]
        print(f"{model['name']}: {len(plan)} buckets of {BUCKET_BYTES / 1e6:g} MB (f32); {len(last)} ready only after the last write "
              f"(the embedding), {sum(h - l for l, h, _ in last) * 4 / 1e6:.1f} MB of {total * 4 / 1e6:.1f} MB")
    print(f"latency per collective (ring, NCCL's constants): " + ", ".join(
        f"p={p}: all-reduce {ring_latency(p, 2) * 1e6:.1f} us, reduce-scatter/all-gather {ring_latency(p, 1) * 1e6:.1f} us, "
        f"tree all-reduce {tree_allreduce_latency(p) * 1e6:.1f} us" for p in (2, 8, 64)))

    cells = []
    print("\nCommunication per step, ms (every collective's time, hidden or not; f32 unless noted):\n")
    print(f"| model | GPUs | one all-reduce (`bucket_mb = 0`) | {BUCKET_BYTES / 1e6:g} MB buckets | of which latency | buckets, bf16 "
          "| ZeRO-1, `bucket_mb = 0` | ZeRO-1, buckets |")
    print("|---|---|---|---|---|---|---|---|")
    for model in (g, m):
        for p in (2, 8, 64):
            one = step(model, p, 1.0, overlap=False)
            bk = step(model, p, 1.0)
            bf = step(model, p, 1.0, dtype_bytes=2)
            z1 = step(model, p, 1.0, zero1=True, overlap=False)
            zb = step(model, p, 1.0, zero1=True)
            lat = bk["buckets"] * ring_latency(p, 2)
            print(f"| {model['name']} | {p} | {one['grad_comm_s'] * 1e3:.2f} | {bk['grad_comm_s'] * 1e3:.2f} | "
                  f"{lat * 1e3:.2f} | {bf['grad_comm_s'] * 1e3:.2f} | {(z1['grad_comm_s'] + z1['gather_s']) * 1e3:.2f} | "
                  f"{(zb['grad_comm_s'] + zb['gather_s']) * 1e3:.2f} |")
    print("\nEfficiency = compute / (compute + exposed communication), exposed ms in brackets:\n")
    print("| model, compute per step | GPUs | f32, no overlap | f32, buckets overlapped | bf16, buckets overlapped "
          "| ZeRO-1 f32, buckets overlapped |")
    print("|---|---|---|---|---|---|")
    names = {"": "", "tree": " (tree latency)", "one_nic": " (one NIC's 45 GB/s)"}
    for label, model, comp in cases:
        for p, variant in ((2, ""), (8, ""), (64, ""), (64, "tree"), (64, "one_nic")):
            kw = {"one_nic": variant == "one_nic", "tree_latency": variant == "tree"}
            r = {
                "no_overlap_f32": step(model, p, comp, overlap=False, **kw),
                "overlap_f32": step(model, p, comp, **kw),
                "overlap_bf16": step(model, p, comp, dtype_bytes=2, **kw),
                "zero1_overlap_f32": step(model, p, comp, zero1=True, **kw),
                "zero1_no_overlap_f32": step(model, p, comp, zero1=True, overlap=False, **kw),
            }
            cells.append({"case": label, "p": p, "variant": variant, "compute_ms": comp * 1e3,
                          **{k: {kk: (vv * 1e3 if kk.endswith("_s") else vv) for kk, vv in v.items()} for k, v in r.items()}})
            fmt = lambda x: f"{x['efficiency'] * 100:.1f}% ({x['exposed_s'] * 1e3:.2f})"
            print(f"| {label}, {comp * 1e3:.1f} ms | {p}{names[variant]} | {fmt(r['no_overlap_f32'])} | "
                  f"{fmt(r['overlap_f32'])} | {fmt(r['overlap_bf16'])} | {fmt(r['zero1_overlap_f32'])} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cells": cells}, f, indent=2)


if __name__ == "__main__":
    main()
