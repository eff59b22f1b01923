"""What every section uses: progress lines, the optional nvmath-python, relative error, freeing
GPU memory between sections."""

from __future__ import annotations

import gc
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


def max_relative(torch, got, expected) -> float:
    got, expected = torch.as_tensor(got, device="cuda").float(), torch.as_tensor(expected, device="cuda").float()
    return float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def free_memory(torch) -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def epilog_named(name: str):
    """``MatmulEpilog[name]``, spelled through ``__members__``: mypy reads ``MatmulEpilog[...]`` as a
    type application, ``MatmulEpilog`` being the generated enum's alias while type checking."""
    from nvblaslt import MatmulEpilog

    return MatmulEpilog.__members__[name]
