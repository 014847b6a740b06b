#!/usr/bin/env python3
"""[adapter] and the adapter exports refuse what they cannot do with exit 2 and a message naming
the key or option (no torch needed): targets inside the fused MLP, an empty or repeated target, a
layer of another role as the adapter, rank 0, --format peft or --merge
on a run without adapters, --format hf without --merge on a LoRA run, --merge with peft. A LoRA run
of the tiny experiment trains (its run.json counts the trainable and frozen parameters, its
summary the state not kept), evaluates, and resumes.
usage: test_lora_inputs.py ABLATE_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "tiny_sweep_base.toml")
LORA = ["--set", "adapter.name=lora", "--set", "adapter.lora.rank=2", "--set", "run.steps=6", "--set", "run.eval_every=0"]


def call(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    ablate = os.path.abspath(sys.argv[1])
    failures = 0

    def refused(what, cmd, *needles):
        nonlocal failures
        r = call(cmd)
        text = r.stdout + r.stderr
        ok = r.returncode == 2 and all(n in text for n in needles)
        print(f"{what}: exit {r.returncode}: {'ok' if ok else 'WRONG'}")
        if not ok:
            print(text)
        failures += not ok

    with tempfile.TemporaryDirectory() as tmp:
        train = [ablate, "train", BASE]
        refused("an MLP target", train + ["--run-dir", f"{tmp}/a", *LORA, "--set", 'adapter.targets=["q","up"]'],
                "adapter.targets", "'up'", "fused")
        refused("no target", train + ["--run-dir", f"{tmp}/b", *LORA, "--set", "adapter.targets=[]"], "adapter.targets")
        refused("a target twice", train + ["--run-dir", f"{tmp}/c", *LORA, "--set", 'adapter.targets=["v","v"]'],
                "adapter.targets", "twice")
        refused("a linear as the adapter", train + ["--run-dir", f"{tmp}/d", *LORA, "--set", "adapter.name=linear"],
                "adapter.name", "role")
        refused("rank 0", train + ["--run-dir", f"{tmp}/f", *LORA, "--set", "adapter.lora.rank=0"], "adapter.lora.rank")
        # The old spelling, [adapter] rank, is lora's own key now: moved there with a warning, and used.
        old = call(train + ["--run-dir", f"{tmp}/old", "--set", "adapter.name=lora", "--set", "adapter.rank=3", "--set", "run.steps=1"])
        moved = old.returncode == 0 and "adapter.rank is now adapter.lora.rank" in old.stdout + old.stderr
        with open(f"{tmp}/old/config.toml") as f:
            moved = moved and "[adapter.lora]\nalpha = 16.0\ndropout = 0.0\nrank = 3\n" in f.read()
        print(f"[adapter] rank moved to [adapter.lora]: exit {old.returncode}: {'ok' if moved else 'WRONG'}")
        if not moved:
            print(old.stdout, old.stderr)
        failures += not moved
        refused("base_dtype int4", train + ["--run-dir", f"{tmp}/g", *LORA, "--set", "adapter.base_dtype=int4"], "adapter.base_dtype")

        plain, lora = f"{tmp}/plain", f"{tmp}/lora"
        for d, extra in ((plain, ["--set", "run.steps=2"]), (lora, LORA)):
            r = call(train + ["--run-dir", d, *extra])
            if r.returncode != 0:
                print(r.stdout, r.stderr)
                return 1
        refused("--format peft without adapters", [ablate, "export", "--checkpoint", plain, "--format", "peft", "--out", f"{tmp}/x"],
                "--format", "without an [adapter]")
        refused("--merge without adapters", [ablate, "export", "--checkpoint", plain, "--merge", "--out", f"{tmp}/x"],
                "--merge", "nothing to merge")
        refused("--format hf of a LoRA run", [ablate, "export", "--checkpoint", lora, "--out", f"{tmp}/x"], "--merge", "--format peft")
        refused("--merge with peft", [ablate, "export", "--checkpoint", lora, "--format", "peft", "--merge", "--out", f"{tmp}/x"],
                "--merge")

        run_json = json.load(open(os.path.join(lora, "run.json")))
        summary = json.load(open(os.path.join(lora, "summary.json")))
        # d_model 32, 1 block, q and v adapted at rank 2: each (2 x 32) + (32 x 2).
        ok = (run_json["trainable_parameters"] == 2 * (2 * 32 + 32 * 2) and
              run_json["frozen_parameters"] + run_json["trainable_parameters"] == run_json["parameters"] and
              run_json["grad_bytes"] == 4 * run_json["trainable_parameters"] and
              summary["frozen_state_bytes_saved"] == run_json["frozen_parameters"] * (4 + 8) and
              summary["optimizer_state_bytes"] == 8 * run_json["trainable_parameters"])
        print(f"run.json: {run_json['trainable_parameters']} trainable of {run_json['parameters']}; summary: "
              f"{summary['frozen_state_bytes_saved']} bytes not kept: {'ok' if ok else 'WRONG'}")
        failures += not ok
        r = call(train + ["--run-dir", lora, *LORA, "--set", "run.steps=8", "--resume"])
        ok = r.returncode == 0 and json.load(open(os.path.join(lora, "summary.json")))["steps"] == 8
        print(f"a LoRA run resumes to step 8: {'ok' if ok else 'WRONG'}")
        if not ok:
            print(r.stdout, r.stderr)
        failures += not ok
        # An NF4 base: stopped at step 3 and resumed, the losses are the uninterrupted run's bit for bit
        # (the checkpoint's dequantized weights quantize back to the same codes).
        nf4 = [*LORA, "--set", "adapter.base_dtype=nf4", "--set", "adapter.lora.dropout=0.1"]
        whole, parts = f"{tmp}/nf4-whole", f"{tmp}/nf4-parts"
        runs = [train + ["--run-dir", whole, *nf4], train + ["--run-dir", parts, *nf4, "--stop-at", "3"],
                train + ["--run-dir", parts, *nf4, "--resume"]]
        for cmd in runs:
            r = call(cmd)
            if r.returncode != 0:
                print(r.stdout, r.stderr)
                return 1

        def losses(d):
            return [(m["step"], m["loss"]) for m in map(json.loads, open(os.path.join(d, "metrics.jsonl"))) if "loss" in m and "step" in m]
        a, b = losses(whole), losses(parts)
        held = json.load(open(os.path.join(whole, "run.json")))
        ok = len(a) == 6 and a == b[-6:] if len(b) >= 6 else False
        ok = ok and held["nf4_parameters"] == 4 * 32 * 32 + 2 * 32 * 128 and held["nf4_bytes"] == held["nf4_parameters"] // 2 + 4 * held["nf4_parameters"] // 64
        print(f"nf4 base, dropout 0.1: stopped at 3 and resumed gives the uninterrupted losses ({a[-1][1] if a else None}); "
              f"{held['nf4_parameters']} weights in {held['nf4_bytes']} bytes: {'ok' if ok else 'WRONG'}")
        if not ok:
            print(a, b)
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
