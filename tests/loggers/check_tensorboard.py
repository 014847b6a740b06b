#!/usr/bin/env python3
"""Reads the tensorboard logger's event files with the tensorboard package and checks every scalar
against metrics.jsonl, which the jsonl logger wrote from the same steps (a run of steps 1..4, then
a run resumed at step 2 that logged steps 3..4 again with other losses: TensorBoard must show the
resumed values). Exits 77 (skipped) where the tensorboard package is not installed.

Usage: check_tensorboard.py <loggers_sample_run> <libablate_loggers.so>
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("skipped: the tensorboard Python package is not installed")
    sys.exit(77)

COUNTS = {"step", "tokens", "real_tokens", "mem_peak_bytes", "optimizer_state_bytes"}


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def tag_for(name):
    return "val/" + name[4:] if name.startswith("val_") else "train/" + name


def main():
    writer, plugin = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="ablate-tb-") as run_dir:
        subprocess.run([writer, plugin, run_dir], check=True)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        assert [r["step"] for r in rows] == [1, 2, 3, 4], rows

        expected = {}
        for row in rows:
            for name, value in row.items():
                if name != "step":
                    expected.setdefault(tag_for(name), []).append((row["step"], as_float32(value)))

        tb_dir = os.path.join(run_dir, "tensorboard")
        files = sorted(os.listdir(tb_dir))
        assert len(files) == 2 and all(f.startswith("events.out.tfevents.") for f in files), files
        acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
        acc.Reload()
        tags = sorted(acc.Tags()["scalars"])
        assert tags == sorted(expected), (tags, sorted(expected))
        for tag, want in expected.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            assert got == want, (tag, got, want)
        print(f"ok: {len(tags)} tags, {sum(len(v) for v in expected.values())} scalars match metrics.jsonl")


if __name__ == "__main__":
    main()
