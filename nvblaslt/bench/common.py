"""What every section uses: progress lines, the optional nvmath-python, relative error, freeing
GPU memory between sections, CUDA-graph capture."""

from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import math
import sys
import time

STARTED = time.perf_counter()


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)


def nvmath_advanced():
    """nvmath.linalg.advanced if installed (an optional comparison), else None."""
    try:
        import nvmath.linalg.advanced as advanced
    except ImportError:
        return None
    return advanced


def max_relative(torch, got, expected, *, chunk_bytes: int = 1 << 30) -> float:
    """Largest |got - expected| over the largest |expected| (NaN if either holds a NaN where the other
    differs), in slices along the first axis, each in float32 or the inputs' wider type: a DeepSeek-sized
    weight gradient is 7.5 GB in bf16, and one float64 copy of it would not fit."""
    got = torch.as_tensor(got)
    expected = torch.as_tensor(expected, device=got.device)
    if got.shape != expected.shape:
        raise ValueError(f"max_relative: shapes differ, {tuple(got.shape)} and {tuple(expected.shape)}")
    if expected.numel() == 0:
        return 0.0
    wide = torch.promote_types(torch.promote_types(got.dtype, expected.dtype), torch.float32)
    got, expected = got.reshape(-1, *got.shape[1:]), expected.reshape(-1, *expected.shape[1:])  # 0-d: one row
    rows = max(1, chunk_bytes // (torch.empty((), dtype=wide).element_size() * max(1, expected[0].numel())))
    worst = largest = 0.0
    for start in range(0, expected.shape[0], rows):
        g, e = got[start:start + rows].to(wide), expected[start:start + rows].to(wide)
        difference = float((g - e).abs().max())
        if math.isnan(difference):  # max() of Python floats would drop it
            return math.nan
        worst, largest = max(worst, difference), max(largest, float(e.abs().max()))
    return worst / max(largest, 1e-30)


def free_memory(torch) -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def epilog_named(name: str):
    """``MatmulEpilog[name]``, spelled through ``__members__``: mypy reads ``MatmulEpilog[...]`` as a
    type application, ``MatmulEpilog`` being the generated enum's alias while type checking."""
    from nvblaslt import MatmulEpilog

    return MatmulEpilog.__members__[name]


def captured(torch, fn):
    """(a CUDA graph of ``fn``, what ``fn`` returned while captured): captured after three warm-up calls on
    a side stream (plans made outside it), as PyTorch's whole-network capture does."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        value = fn()
    return graph, value


@contextlib.contextmanager
def own_tuning_cache(prefix: str):
    """An empty tuning cache of the run's own while the block runs (``NVBLASLT_CACHE_DIR`` set, then put
    back): its "heuristic plans" are the heuristics' own, not the user's searched picks, and what it
    searches never reaches the user's cache."""
    from .._tuning_cache import ENV_CACHE_DIR

    saved = os.environ.get(ENV_CACHE_DIR)
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        os.environ[ENV_CACHE_DIR] = scratch
        try:
            yield scratch
        finally:
            if saved is None:
                os.environ.pop(ENV_CACHE_DIR, None)
            else:
                os.environ[ENV_CACHE_DIR] = saved
