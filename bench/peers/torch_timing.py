"""The PyTorch peers' timer: the median of `iters` calls in milliseconds after two untimed ones,
with CUDA events on a GPU (so the host's launch time is not counted) and the host clock on a CPU."""
import statistics
import time


def median_ms(torch, fn, iters, cuda):
    fn()
    fn()
    times = []
    for _ in range(iters):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_or_skip(name, device):
    """PyTorch, or None after saying why this peer is skipped (no torch, or no CUDA device for cuda)."""
    try:
        import torch
    except ImportError as e:
        print(f"{name}: torch is not installed ({e}); skipped")
        return None
    if device == "cuda" and not torch.cuda.is_available():
        print(f"{name}: no CUDA device; skipped")
        return None
    return torch
