"""The cases of the GPU stress script (``gpu_stress.py``), one per name, each run in its own process:

    python -m tests.stress._stress_cases NAME      # prints JSON lines: notes, then {"status": ...}
    python -m tests.stress._stress_cases --list    # the names (run both from the repository root)

A case passes when every call is either correct against float64 or refused with an
``nvblaslt.NvblasltError``. It fails as ``wrong`` (exit 3) when a call returns a wrong result
without an error, and as ``error`` (exit 1) on any other exception (a raw ctypes/KeyError, a
broken CUDA graph capture, a library left unusable). A crash or a hang is judged by the parent.
The cases cover issue 10: broadcast epilog inputs with batches, the BGRADB/BGRADA kernel guard,
threads, free() and gc with queued work, malformed DLPack/CAI, misalignment, CUDA graph capture,
stream kinds, host operands, memory pressure, lifetimes, NaN/Inf, K=0/empty/1×1/huge K,
negative/zero strides, aliasing, tuning-cache corruption and concurrent cache writers.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import numpy as np

from tests.reference import gelu, gelu_grad, host_bits, host_exact, package_of, unpack_relu_bits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where ``tests`` imports from

CASES: dict[str, tuple] = {}  # name -> (function, timeout_s, exclusive)


def case(timeout: float = 60, exclusive: bool = False):
    def register(function):
        CASES[function.__name__.replace("_", "-")] = (function, timeout, exclusive)
        return function
    return register


class Wrong(AssertionError):
    """A call returned a wrong result without raising."""


class Skip(Exception):
    """This machine lacks what the case needs (a package, a second GPU)."""


def note(message: str) -> None:
    print(json.dumps({"note": str(message)[:500]}), flush=True)


# ---- helpers ---------------------------------------------------------------------------------------------------
def _torch():
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"torch is not installed ({exc})") from exc
    if not torch.cuda.is_available():
        raise Skip("torch sees no GPU")
    return torch


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


RNG = rng_for("default")


def rnd(shape, dtype=None, layout="row", scale=1.0, rng=None):
    """A fresh random CUDA tensor of logical ``shape``, stored row- or column-major."""
    torch = _torch()
    dtype = dtype or torch.float32
    rng = rng or RNG
    stored = tuple(shape) if layout == "row" or len(shape) < 2 else (*shape[:-2], shape[-1], shape[-2])
    t = torch.from_numpy(rng.standard_normal(stored) * scale).to(torch.float32).to(dtype).cuda()
    return t if layout == "row" or len(shape) < 2 else t.transpose(-1, -2)


def split(result):
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result
    return result, {}


U_OUT = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}


def close(what: str, got, ref: np.ndarray, terms: np.ndarray, dtype: str = "float32", k: int = 1,
          extra: float = 0.0) -> None:
    """|got - ref| <= (4·K·u_acc + extra)·terms + 2·u_out·|ref| elementwise, NaN where ref is finite is wrong."""
    got = host_exact(got)
    if got.shape != ref.shape:
        if got.size == ref.size:
            got = got.reshape(ref.shape)
        else:
            raise Wrong(f"{what}: shape {got.shape}, expected {ref.shape}")
    bound = (4 * k * 2.0**-24 + extra + 1e-7) * terms + 2 * U_OUT.get(dtype, 2.0**-23) * np.abs(ref) + 1e-30
    finite = np.isfinite(ref)
    bad = (finite & ~np.isfinite(got)) | (finite & (np.abs(got - ref) > bound))
    if bad.any():
        worst = float(np.max(np.where(bad & np.isfinite(got), np.abs(got - ref) / bound, 0)))
        raise Wrong(f"{what}: {int(bad.sum())} of {bad.size} elements wrong (worst {worst:.3g}× the bound)")


def dtype_of(t) -> str:
    return str(t.dtype).rpartition(".")[2]


def refused_or(what: str, call, check=None):
    """``call()``: an NvblasltError is a refusal (noted, fine); a result must pass ``check``; anything else
    propagates and fails the case."""
    import nvblaslt

    try:
        result = call()
    except nvblaslt.NvblasltError as exc:
        note(f"{what}: refused ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
        return None
    sync()
    if check is not None:
        check(result)
    note(f"{what}: accepted, correct")
    return result


def sync() -> None:
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    if "cupy" in sys.modules:
        sys.modules["cupy"].cuda.Device().synchronize()


def forward_reference(a, b, bias=None, c=None, alpha=1.0, beta=1.0):
    """(Z, |terms|) of alpha·a@b + beta·c + bias (bias broadcast as a column per nvmath-python)."""
    A, B = host_exact(a), host_exact(b)
    z = alpha * np.matmul(A, B)
    terms = abs(alpha) * np.matmul(np.abs(A), np.abs(B))
    if c is not None:
        C = host_exact(c)
        z, terms = z + beta * C, terms + abs(beta) * np.abs(C)
    if bias is not None:
        z, terms = z + bias, terms + np.abs(bias)
    return z, terms


# ---- broadcast epilog inputs with batched problems ---------------------------------------------------------------
@case()
def bias_broadcast_batched():
    """Bias (1, M), (M,), (M, 1), (B, M), (B, M, 1), (1, M, 1) with a batch of 3: right or refused."""
    torch = _torch()
    import nvblaslt

    B, M, N, K = 3, 24, 16, 8
    for dtype in (torch.float32, torch.float16):
        name = dtype_of(rnd((1,), dtype))
        for epilog in ("BIAS", "RELU_BIAS", "GELU_BIAS"):
            for shape in [(1, M), (M,), (M, 1), (B, M), (B, M, 1), (1, M, 1)]:
                for b_batched in (False, True):
                    a = rnd((B, M, K), dtype)
                    b = rnd((B, K, N) if b_batched else (K, N), dtype)
                    bias = rnd(shape, dtype)
                    hb = host_exact(bias)
                    # what each shape means: one column per batch, or one shared by all
                    per_batch = (hb[:, :, None] if shape == (B, M) else hb if shape == (B, M, 1)
                                 else hb.reshape(1, M, 1))
                    z, terms = forward_reference(a, b, per_batch)
                    ref = {"BIAS": z, "RELU_BIAS": np.maximum(z, 0), "GELU_BIAS": gelu(z)}[epilog]

                    def check(d, ref=ref, terms=terms, what=f"{epilog} {name} bias{shape}"):
                        close(what, d, ref, terms * 1.2, name, K, extra=2.0**-11)
                    refused_or(f"{epilog} {name} bias{shape} b{'3-D' if b_batched else '2-D'}",
                               lambda a=a, b=b, bias=bias, epilog=epilog: nvblaslt.matmul(
                                   a, b, epilog=epilog, epilog_inputs={"bias": bias}), check)


@case()
def aux_broadcast_batched():
    """2-D (and (1, ld, N)) relu_aux/gelu_aux with batched DRELU/DGELU(_BGRAD): right or refused."""
    torch = _torch()
    import nvblaslt

    B, M, N, K, KF = 3, 40, 24, 16, 12
    for dtype in (torch.float32, torch.float16):
        name = dtype_of(rnd((1,), dtype))
        for kind in ("RELU", "GELU"):
            x, w, fb = rnd((M, KF), dtype), rnd((KF, N), dtype), rnd((M,), dtype)
            _, aux = split(nvblaslt.matmul(x, w, epilog=f"{kind}_AUX_BIAS", epilog_inputs={"bias": fb}))
            key = f"{kind.lower()}_aux"
            stored = aux[key]
            for backward in (f"D{kind}", f"D{kind}_BGRAD"):
                for form in ("2-D", "(1, ld, N)"):
                    given = stored if form == "2-D" else stored[None]
                    g, h = rnd((B, M, K), dtype), rnd((B, K, N), dtype)
                    z, terms = forward_reference(g, h)
                    if kind == "RELU":
                        factor = unpack_relu_bits(host_bits(stored), M).astype(float)
                    else:
                        factor = gelu_grad(host_exact(stored)[:M, :])
                    ref = z * factor[None]

                    def check(result, ref=ref, terms=terms, backward=backward, form=form):
                        d, outputs = split(result)
                        close(f"{backward} {name} aux {form}: D", d, ref, terms * 1.2, name, K, extra=2.0**-11)
                        if backward.endswith("BGRAD"):
                            vector = outputs.get(f"d{kind.lower()}_bgrad")
                            if vector is None:
                                raise Wrong(f"{backward}: no d{kind.lower()}_bgrad output (keys {sorted(outputs)})")
                            close(f"{backward} {name} aux {form}: bias gradient", vector, ref.sum(-1),
                                  (terms * 1.2).sum(-1), name, K + N, extra=2.0**-11)
                    refused_or(f"{backward} {name} batched with {form} {key}",
                               lambda g=g, h=h, given=given, backward=backward, key=key: nvblaslt.matmul(
                                   g, h, epilog=backward, epilog_inputs={key: given}), check)


# ---- the BGRADB / BGRADA kernel guard ------------------------------------------------------------------------------
def _bias_gradient_repeats(which: str, shapes, layouts, search: bool = False):
    torch = _torch()
    import nvblaslt

    failures = []
    for m, n, k in shapes:
        for layout in layouts:
            if which == "BGRADB":
                a, b = rnd((m, k), torch.float16), rnd((k, n), torch.float16, layout)
                operand, axis = b, 0
            else:
                a, b = rnd((m, k), torch.float16, layout), rnd((k, n), torch.float16)
                operand, axis = a, 1
            host = host_exact(operand)
            ref, terms = host.sum(axis=axis), np.abs(host).sum(axis=axis)
            for form in ("matmul", "Matmul", "Matmul+autotune") + (("Matmul+search",) if search else ()):
                results = []
                try:
                    if form == "matmul":
                        for _ in range(20):
                            _, aux = split(nvblaslt.matmul(a, b, epilog=which))
                            results.append(host_exact(aux[which.lower()]))
                    else:
                        with nvblaslt.Matmul(a, b) as mm:
                            mm.plan(epilog=which)
                            if form != "Matmul":
                                mm.autotune(iterations=3, search=form == "Matmul+search")
                            for _ in range(20):
                                _, aux = split(mm.execute())
                                results.append(host_exact(aux[which.lower()]))
                except nvblaslt.NvblasltError as exc:
                    note(f"{which} M={m} N={n} K={k} {layout} {form}: refused ({exc})"[:300])
                    continue
                sync()
                what = f"{which} fp16 M={m} N={n} K={k} {layout}-major {form}"
                distinct = len({r.tobytes() for r in results})
                stacked = np.stack([r.reshape(ref.shape) for r in results])
                bound = 2.0**-9 * terms + 1e-3
                worst = float(np.max(np.abs(stacked - ref) / bound))
                spread = float(np.max((stacked.max(0) - stacked.min(0)) / (2.0**-9 * np.abs(ref) + 1e-3)))
                if worst > 1 or spread > 1:  # nondeterminism beyond a rounding of the fp16 output is a fault
                    failures.append(f"{what}: {distinct} distinct results in 20, worst error {worst:.3g}× the bound "
                                    f"(2^-9·Σ|terms|), spread {spread:.3g}× 2^-9·|ref|")
                else:
                    note(f"{what}: 20 correct results, {distinct} distinct")
    if failures:
        raise Wrong("; ".join(failures[:6]))


@case(timeout=120)
def bgradb_fp16_m1():
    """BGRADB, fp16, M=1, N=4, K=384/512/1024: 20 runs each, identical and within Σ|terms| bounds."""
    _bias_gradient_repeats("BGRADB", [(1, 4, 384), (1, 4, 512), (1, 4, 1024), (1, 8, 384)], ("row", "col"),
                           search=True)


@case(timeout=120)
def bgrada_fp16_n1():
    """BGRADA, fp16, N=1, M=4, K=384/512/1024: the same probe for the A-side bias gradient."""
    _bias_gradient_repeats("BGRADA", [(4, 1, 384), (4, 1, 512), (4, 1, 1024), (8, 1, 384)], ("col", "row"),
                           search=True)


# ---- threads --------------------------------------------------------------------------------------------------
def _threads(own_streams: bool):
    torch = _torch()
    import nvblaslt

    M = N = K = 256
    a, b, bias = rnd((M, K), torch.float16), rnd((K, N), torch.float16), rnd((M,), torch.float16)
    z, terms = forward_reference(a, b, host_exact(bias)[:, None])
    mm = nvblaslt.Matmul(a, b)
    mm.plan(epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
    results, refusals, raw = [], [], []
    start = threading.Barrier(8)

    def worker():
        stream = torch.cuda.Stream() if own_streams else None
        start.wait()
        for _ in range(50):
            try:
                results.append(split(mm.execute(stream=stream) if stream is not None else mm.execute()))
            except nvblaslt.NvblasltError as exc:
                refusals.append(exc)
                return
            except Exception as exc:  # noqa: BLE001
                raw.append(exc)
                return
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sync()
    if raw:
        raise RuntimeError(f"{len(raw)} threads raised non-nvblaslt errors, e.g. {type(raw[0]).__name__}: {raw[0]}")
    wrong = 0
    decided = np.abs(z) > 0.05
    for d, aux in results:
        try:
            close("D", d, np.maximum(z, 0), terms, "float16", K)
            mask = unpack_relu_bits(host_bits(aux["relu_aux"]), M)
            if (decided & (mask != (z > 0))).any():
                raise Wrong("relu_aux")
        except Wrong:
            wrong += 1
    what = f"8 threads × 50 executes of one Matmul ({'own streams' if own_streams else 'one stream'})"
    if wrong:
        raise Wrong(f"{what}: {wrong} of {len(results)} results wrong, {len(refusals)} refusals")
    note(f"{what}: {len(results)} correct results, {len(refusals)} threads refused"
         + (f" ({refusals[0]})" if refusals else ""))
    mm.free()


@case(timeout=120)
def threads_own_streams():
    """One Matmul executed from 8 threads at once, each on its own stream: raise, or be right."""
    _threads(True)


@case(timeout=120)
def threads_one_stream():
    """One Matmul executed from 8 threads at once on the current stream: raise, or be right."""
    _threads(False)


# ---- free() / gc while a kernel is queued; lifetimes --------------------------------------------------------------
def _sleep_on(stream, ms: float = 300):
    torch = _torch()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(ms * 1.5e6))  # cycles: ~1.5 GHz


def _fill_new_memory():
    """New allocations through three allocators, filled right away on the legacy default stream."""
    torch = _torch()
    from cuda.bindings import runtime as cudart

    torch_blocks = [torch.full(((1 << s) // 4,), 7.0, device="cuda") for s in range(20, 27)]
    raw = []
    for s in range(20, 27):
        err, pointer = cudart.cudaMallocAsync(1 << s, 0)
        if int(err) == 0:
            cudart.cudaMemsetAsync(pointer, 0x5A, 1 << s, 0)
            raw.append((pointer, 1 << s))
    cupy_blocks = []
    with contextlib.suppress(ImportError):
        import cupy

        cupy_blocks = [cupy.full(((1 << s) // 4,), 9.0, dtype=np.float32) for s in range(20, 26)]
    return torch_blocks, raw, cupy_blocks


def _check_new_memory(blocks):
    from cuda.bindings import runtime as cudart

    torch_blocks, raw, cupy_blocks = blocks
    sync()
    for t in torch_blocks:
        if not bool((t == 7.0).all()):
            raise Wrong(f"a torch allocation made after the release was overwritten ({t.numel() * 4} bytes)")
    for pointer, size in raw:
        host = np.empty(size, dtype=np.uint8)
        cudart.cudaMemcpy(host.ctypes.data, pointer, size, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        cudart.cudaFree(pointer)
        if not (host == 0x5A).all():
            raise Wrong(f"a cudaMallocAsync allocation made after the release was overwritten ({size} bytes, "
                        f"{int((host != 0x5A).sum())} bytes changed)")
    for c in cupy_blocks:
        if not bool((c == 9.0).all()):
            raise Wrong("a CuPy allocation made after the release was overwritten")


def _queued_release(release: str):
    torch = _torch()
    import nvblaslt

    stream = torch.cuda.Stream()
    shapes = ((64, 64, 1 << 16), (32, 48, 1 << 17), (256, 256, 1 << 14))
    for i, (m, n, k) in enumerate(shapes):  # the first problem whose algorithms use a workspace
        a, b = rnd((m, k)), rnd((k, n))
        mm = nvblaslt.Matmul(a, b, stream=stream)
        algorithms = mm.plan()
        workspace = max((getattr(r, "workspace_size", 0) for r in algorithms), default=0)
        if workspace or i == len(shapes) - 1:
            break
        mm.free()
    note(f"problem {m}×{k} @ {k}×{n}, workspace {workspace} bytes" + ("" if workspace else
                                                                         " (none: this probe proves less)"))
    z, terms = forward_reference(a, b)
    torch.cuda.synchronize()
    _sleep_on(stream)
    d = mm.execute(stream=stream)
    if release == "free":
        mm.free()
    else:
        del mm
        gc.collect()
    blocks = _fill_new_memory()
    _check_new_memory(blocks)
    close("D computed while its plan was released", d, z, terms, "float32", k)


@case()
def free_while_queued():
    """Matmul.free() with its kernel still queued behind a sleep on a non-blocking stream: the result and
    memory allocated (and written) afterwards are both intact."""
    _queued_release("free")


@case()
def gc_while_queued():
    """The same, with the plan dropped and garbage-collected instead of freed."""
    _queued_release("gc")


@case()
def lifetimes():
    """Operands dropped while the result is in flight (function form, framework stream and an explicit
    stream), and results outliving their plans."""
    torch = _torch()
    import nvblaslt

    # function form on the current stream: dropping a and b right after the call is always fine
    a, b = rnd((512, 2048)), rnd((2048, 256))
    z, terms = forward_reference(a, b)
    _sleep_on(torch.cuda.current_stream(), 200)
    d = nvblaslt.matmul(a, b)
    del a, b
    gc.collect()
    junk = [torch.full((1 << 20,), 3.0, device="cuda") for _ in range(8)]
    sync()
    close("function form, operands dropped in flight", d, z, terms, "float32", 2048)
    if not all(bool((j == 3.0).all()) for j in junk):
        raise Wrong("memory allocated after the operands were dropped was overwritten")
    del junk
    # Matmul: operands dropped after execute, plan freed, results kept
    a, b, bias = rnd((256, 512)), rnd((512, 128)), rnd((256,))
    z, terms = forward_reference(a, b, host_exact(bias)[:, None])
    mm = nvblaslt.Matmul(a, b)
    mm.plan(epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
    _sleep_on(torch.cuda.current_stream(), 200)
    d, aux = split(mm.execute())
    del a, b, bias
    mm.free()
    del mm
    gc.collect()
    junk = [torch.full((1 << 20,), 5.0, device="cuda") for _ in range(8)]
    sync()
    if not all(bool((j == 5.0).all()) for j in junk):
        raise Wrong("memory allocated after the plan was freed was overwritten")
    close("Matmul result after its plan and operands are gone", d, np.maximum(z, 0), terms, "float32", 512)
    mask = unpack_relu_bits(host_bits(aux["relu_aux"]), 256)
    if ((np.abs(z) > 1e-3) & (mask != (z > 0))).any():
        raise Wrong("relu_aux after its plan and operands are gone")


# ---- malformed DLPack / CAI / extents --------------------------------------------------------------------------------
def _capsule_cases():
    from tests.fuzz._fuzz_inputs import Capsule

    torch = _torch()
    keep = torch.zeros(64 * 64, device="cuda")
    base = dict(shape=(64, 64), dtype="float32", data=keep.data_ptr(), device=(2, torch.cuda.current_device()),
                keep=keep)
    return keep, Capsule, base


def _must_refuse(what: str, call):
    import nvblaslt

    try:
        call()
    except nvblaslt.NvblasltError as exc:
        note(f"{what}: refused ({' '.join(str(exc).split())[:160]})")
        return
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"{what}: raised {type(exc).__name__} instead of an NvblasltError: {exc}") from exc
    raise Wrong(f"{what}: accepted")


@case()
def dlpack_huge_ndim():
    """A DLPack capsule claiming ndim 2**30 (and 2**31-1, -1, a NULL shape) over real GPU memory: refused
    before its shape is read."""
    import nvblaslt

    keep, Capsule, base = _capsule_cases()
    good = Capsule(**base)
    for label, changes in (("ndim=2**30", {"ndim": 2**30}), ("ndim=2**31-1", {"ndim": 2**31 - 1}),
                           ("ndim=-1", {"ndim": -1}), ("shape NULL", {"shape": None, "strides": None, "ndim": 2}),
                           ("strides NULL, ndim 2**30", {"strides": None, "ndim": 2**30})):
        bad = Capsule(**{**base, **changes})
        _must_refuse(f"a: {label}", lambda bad=bad: nvblaslt.matmul(bad, good))
        _must_refuse(f"b: {label}", lambda bad=bad: nvblaslt.matmul(good, bad))
        _must_refuse(f"bias: {label}", lambda bad=bad: nvblaslt.matmul(good, good, epilog="BIAS",
                                                                        epilog_inputs={"bias": bad}))


@case()
def bad_extents():
    """Negative extents, NULL data for a non-empty array, extents overflowing 64 bits, float extents,
    MatrixLayout(rows=2**64+4): refused, never wrapped or passed to C."""
    import nvblaslt
    from tests.fuzz._fuzz_inputs import CAI

    keep, Capsule, base = _capsule_cases()
    good = Capsule(**base)
    pointer = base["data"]
    for label, bad in (
            ("negative extent", Capsule(**{**base, "shape": (-64, 64), "strides": (64, 1)})),
            ("NULL data, non-empty", Capsule(**{**base, "data": None})),
            ("extents overflow int64", Capsule(**{**base, "shape": (2**62, 2**62), "strides": (1, 1)})),
            ("extent 2**63-1", Capsule(**{**base, "shape": (2**63 - 1, 64), "strides": (64, 1)})),
            ("strides overflow", Capsule(**{**base, "strides": (2**62, 1)})),
            ("CAI float extents", CAI({"shape": (64.0, 64.0), "typestr": "<f4", "data": (pointer, False),
                                       "version": 3, "strides": None})),
            ("CAI negative extent", CAI({"shape": (-64, 64), "typestr": "<f4", "data": (pointer, False),
                                         "version": 3, "strides": None})),
            ("CAI NULL data", CAI({"shape": (64, 64), "typestr": "<f4", "data": (0, False), "version": 3,
                                   "strides": None}))):
        _must_refuse(f"a: {label}", lambda bad=bad: nvblaslt.matmul(bad, good))
    lt = nvblaslt.library().api
    for label, args in (("rows=2**64+4", (lt.CUDA_R_32F, 2**64 + 4, 4, 4)), ("rows=-1", (lt.CUDA_R_32F, -1, 4, 4)),
                        ("ld=2**64", (lt.CUDA_R_32F, 4, 4, 2**64)), ("cols=1.5", (lt.CUDA_R_32F, 4, 1.5, 4))):
        _must_refuse(f"MatrixLayout({label})", lambda args=args: nvblaslt.MatrixLayout(*args))


# ---- misalignment -----------------------------------------------------------------------------------------------
def _offset_view(t, elements: int = 1):
    """The same logical array, its storage starting ``elements`` past an aligned address."""
    torch = _torch()
    strides = t.stride()
    size = 1 + sum((n - 1) * s for n, s in zip(t.shape, strides))
    buffer = torch.empty(size + elements, dtype=t.dtype, device=t.device)
    view = torch.as_strided(buffer, t.shape, strides, elements)
    view.copy_(t)
    return view


@case()
def misaligned_pointers():
    """out=, bias, relu_aux, gelu_aux and operands one element past alignment: right or refused."""
    torch = _torch()
    import nvblaslt

    M, N, K = 64, 48, 32
    for dtype in (torch.float16, torch.float32):
        name = dtype_of(rnd((1,), dtype))
        a, b, bias = rnd((M, K), dtype), rnd((K, N), dtype), rnd((M,), dtype)
        z, terms = forward_reference(a, b)
        zb, termsb = forward_reference(a, b, host_exact(bias)[:, None])
        refused_or(f"{name} a misaligned", lambda: nvblaslt.matmul(_offset_view(a), b),
                   lambda d: close("a misaligned", d, z, terms, name, K))
        out = _offset_view(torch.empty((N, M), dtype=dtype, device="cuda")).t()

        def check_out(d, out=out):
            close("out= misaligned", out, z, terms, name, K)
        refused_or(f"{name} out= misaligned", lambda: nvblaslt.matmul(a, b, out=out), check_out)
        refused_or(f"{name} bias misaligned", lambda: nvblaslt.matmul(a, b, epilog="BIAS", epilog_inputs={
            "bias": _offset_view(bias)}), lambda d: close("bias misaligned", d, zb, termsb, name, K))
        _, aux = split(nvblaslt.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias}))
        g, h = rnd((M, K), dtype), rnd((K, N), dtype)
        zg, termsg = forward_reference(g, h)
        mask = unpack_relu_bits(host_bits(aux["relu_aux"]), M)
        refused_or(f"{name} relu_aux misaligned", lambda: nvblaslt.matmul(g, h, epilog="DRELU", epilog_inputs={
            "relu_aux": _offset_view(aux["relu_aux"])}), lambda d: close("relu_aux misaligned", d, zg * mask,
                                                                         termsg, name, K))
        _, gaux = split(nvblaslt.matmul(a, b, epilog="GELU_AUX_BIAS", epilog_inputs={"bias": bias}))
        grad = gelu_grad(host_exact(gaux["gelu_aux"])[:M])
        refused_or(f"{name} gelu_aux misaligned", lambda: nvblaslt.matmul(g, h, epilog="DGELU", epilog_inputs={
            "gelu_aux": _offset_view(gaux["gelu_aux"])}), lambda d: close(
                "gelu_aux misaligned", d, zg * grad, termsg * 1.2, name, K, extra=2.0**-11))


# ---- CUDA graph capture -----------------------------------------------------------------------------------------
def _capture_still_usable():
    torch = _torch()
    x = torch.ones(16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2 + 1
    x.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    if not bool((y == 5).all()):
        raise RuntimeError("a simple graph captured afterwards replays wrongly")
    import nvblaslt

    a, b = rnd((32, 16)), rnd((16, 8))
    z, terms = forward_reference(a, b)
    close("eager matmul after the capture", nvblaslt.matmul(a, b), z, terms, "float32", 16)
    note("afterwards: a new capture and an eager matmul work")


def _capture(label: str, warm: bool, epilog=None, with_out=False):
    torch = _torch()
    import nvblaslt

    M, N, K = 128, 96, 64
    a, b, bias = rnd((M, K)), rnd((K, N)), rnd((M,))
    kwargs = {"epilog": epilog, "epilog_inputs": {"bias": bias}} if epilog else {}
    mm = None
    if with_out:
        mm = nvblaslt.Matmul(a, b)
        mm.plan(**kwargs)
        out = torch.empty_like(mm.execute())  # laid out as D is (it takes A's order, nvmath-python's rule)
        mm.execute(out=out)  # the documented warm-up outside the capture
    elif warm:
        nvblaslt.matmul(a, b, **kwargs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    captured = None
    try:
        with torch.cuda.graph(graph):
            if with_out:
                mm.execute(out=out, stream=torch.cuda.current_stream())
                captured = (out, {})
            else:
                captured = split(nvblaslt.matmul(a, b, **kwargs))
    except nvblaslt.NvblasltError as exc:
        note(f"{label}: refused ({' '.join(str(exc).split())[:200]})")
    except Exception as exc:  # noqa: BLE001 — the capture (or torch's state) was broken
        raise RuntimeError(f"{label}: {type(exc).__name__}: {exc} — the capture did not end cleanly") from exc
    if captured is not None:
        with torch.no_grad():
            a.copy_(rnd((M, K)))
        graph.replay()
        torch.cuda.synchronize()
        column = host_exact(bias)[:, None] if epilog else None
        z, terms = forward_reference(a, b, column)
        d, aux = captured
        ref = np.maximum(z, 0) if epilog and "RELU" in epilog else z
        close(f"{label}: D after replay with new values in a", d, ref, terms, "float32", K)
        if epilog and "AUX" in epilog:
            mask = unpack_relu_bits(host_bits(aux["relu_aux"]), M)
            if ((np.abs(z) > 1e-3) & (mask != (z > 0))).any():
                raise Wrong(f"{label}: relu_aux after replay")
        note(f"{label}: captured, replay correct")
    _capture_still_usable()
    if mm is not None:
        mm.free()


@case()
def graph_function_form_cold():
    """matmul() first called inside a torch CUDA graph capture: works, or refused before touching it."""
    _capture("function form, first call in the capture", warm=False)


@case()
def graph_function_form_warm():
    """matmul() with a cached plan, inside a capture."""
    _capture("function form, plan cached before the capture", warm=True)


@case()
def graph_function_form_aux():
    """matmul(epilog=RELU_AUX_BIAS) (fresh aux outputs) inside a capture."""
    _capture("function form with aux outputs, in the capture", warm=True, epilog="RELU_AUX_BIAS")


@case()
def graph_execute_out():
    """Matmul.execute(out=…) inside a capture after one run outside (the documented way)."""
    _capture("Matmul.execute(out=…) in the capture", warm=True, with_out=True)


# ---- streams ----------------------------------------------------------------------------------------------------
@case()
def stream_kinds():
    """stream= 0, 1 (legacy), 2 (per-thread), torch, CuPy, cuda.core and cuda.bindings streams, and their int
    handles: right after a sync, or refused clearly."""
    torch = _torch()
    import nvblaslt
    from cuda.bindings import runtime as cudart

    M, N, K = 96, 64, 48
    a, b = rnd((M, K)), rnd((K, N))
    z, terms = forward_reference(a, b)
    streams = {"0": 0, "1 (legacy default)": 1, "2 (per-thread default)": 2,
               "torch.cuda.Stream()": torch.cuda.Stream(), "torch current stream": torch.cuda.current_stream(),
               "torch stream handle (int)": torch.cuda.Stream().cuda_stream}
    err, bindings_stream = cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking)
    streams["cuda.bindings cudaStream_t"] = bindings_stream
    with contextlib.suppress(ImportError):
        import cupy

        streams["cupy.cuda.Stream(non_blocking=True)"] = cupy.cuda.Stream(non_blocking=True)
        streams["cupy.cuda.Stream.null"] = cupy.cuda.Stream.null
    core = None
    with contextlib.suppress(Exception):
        try:
            from cuda.core import Device
        except ImportError:
            from cuda.core.experimental import Device
        device = Device()
        device.set_current()
        core = device.create_stream()
        streams["cuda.core Stream"] = core
    torch.cuda.synchronize()
    for label, stream in streams.items():
        for form in ("matmul", "Matmul"):
            def call(stream=stream, form=form):
                if form == "matmul":
                    return nvblaslt.matmul(a, b, stream=stream)
                with nvblaslt.Matmul(a, b, stream=stream) as mm:
                    mm.plan(stream=stream)
                    return mm.execute(stream=stream)
            refused_or(f"stream={label} ({form})", call, lambda d: close(f"stream {label}", d, z, terms, "float32", K))
    cudart.cudaStreamDestroy(bindings_stream)


# ---- host operands -------------------------------------------------------------------------------------------------
@case()
def host_operands():
    """NumPy arrays and CPU torch tensors: staged and returned in host memory in the same package (issue 9),
    or refused clearly — never torch's 'not compiled with CUDA' assertion."""
    torch = _torch()
    import nvblaslt

    M, N, K = 40, 24, 16
    rng = rng_for("host")
    A, B, bias = rng.standard_normal((M, K)), rng.standard_normal((K, N)), rng.standard_normal(M)
    z, terms = A @ B, np.abs(A) @ np.abs(B)
    for label, make in (("numpy", lambda x: x.astype(np.float32)),
                        ("torch cpu", lambda x: torch.from_numpy(x.astype(np.float32)))):
        a, b, bb = make(A), make(B), make(bias)
        expected_package = "numpy" if label == "numpy" else "torch-cpu"

        def check(d, expected_package=expected_package, label=label, ref=z, terms=terms):
            d = split(d)[0]
            if package_of(d) != expected_package:
                raise Wrong(f"{label}: result in {package_of(d)}, expected {expected_package}")
            close(f"{label}: D", d, ref, terms, "float32", K)
        refused_or(f"{label}: matmul", lambda a=a, b=b: nvblaslt.matmul(a, b), check)
        zb = z + bias[:, None]
        refused_or(f"{label}: BIAS", lambda a=a, b=b, bb=bb: nvblaslt.matmul(a, b, epilog="BIAS", epilog_inputs={
            "bias": bb}), lambda d, label=label, zb=zb, expected_package=expected_package: check(
                d, expected_package, label, zb, terms + np.abs(bias)[:, None]))

        def stateful(a=a, b=b, label=label):
            with nvblaslt.Matmul(a, b) as mm:
                mm.plan()
                first = mm.execute()
                A2 = rng.standard_normal((M, K))
                mm.reset_operands(a=make(A2))
                second = mm.execute()
                return first, second, A2

        def check_stateful(result, expected_package=expected_package, label=label):
            first, second, A2 = result
            check(first, expected_package, label)
            check(second, expected_package, f"{label} after reset_operands", A2 @ B, np.abs(A2) @ np.abs(B))
        refused_or(f"{label}: Matmul, reset_operands", stateful, check_stateful)
    _must_refuse("numpy a with a CUDA torch b (packages mixed)", lambda: nvblaslt.matmul(
        A.astype(np.float32), torch.from_numpy(B.astype(np.float32)).cuda()))


# ---- memory pressure (alone on the GPU) ------------------------------------------------------------------------------
def _is_out_of_memory(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return bool(re.search(r"out of memory|OutOfMemory|MemoryAllocation|cudaErrorMemory|CUDA_ERROR_OUT_OF_MEMORY|"
                          r"ALLOC_FAILED|allocation failed|insufficient memory|not enough memory", text, re.I))


@case(timeout=240, exclusive=True)
def memory_pressure():
    """Allocate until the GPU is nearly full: matmul raises a clear out-of-memory error (an NvblasltError, or
    the framework's own OutOfMemoryError), never crashes, and works again once memory is freed."""
    torch = _torch()
    import nvblaslt

    n = 8192
    a, b = rnd((n, n)), rnd((n, n))
    rows = torch.as_tensor(RNG.choice(n, size=8, replace=False), device="cuda")
    ref = host_exact(a[rows]) @ host_exact(b)
    terms = np.abs(host_exact(a[rows])) @ np.abs(host_exact(b))
    small_a, small_b = rnd((64, 64)), rnd((64, 64))
    small_z, small_terms = forward_reference(small_a, small_b)
    nvblaslt.matmul(small_a, small_b)  # handle, library and plan cache ready before the GPU fills
    torch.cuda.synchronize()
    hog, chunk = [], 1 << 30
    while chunk >= 1 << 20:
        try:
            hog.append(torch.empty((chunk,), dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            chunk //= 2
    free, total = torch.cuda.mem_get_info()
    note(f"GPU filled: {free >> 20} MiB of {total >> 30} GiB free")
    outcomes = {}
    for label, call in (("large result", lambda: nvblaslt.matmul(a, b)),
                        ("small problem", lambda: nvblaslt.matmul(small_a, small_b)),
                        ("Matmul plan+execute", lambda: _plan_and_execute(a, b))):
        try:
            result = call()
            sync()
            outcomes[label] = "ran"
            if label == "small problem":
                close("small problem under pressure", result, small_z, small_terms, "float32", 64)
            elif label == "large result":
                close("large result under pressure (rows)", result[rows], ref, terms, "float32", n)
            del result
        except Exception as exc:  # noqa: BLE001
            if not _is_out_of_memory(exc):
                raise RuntimeError(f"{label} under memory pressure: {type(exc).__name__}: {exc} "
                                   f"(expected a clear out-of-memory error)") from exc
            outcomes[label] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
            if not isinstance(exc, nvblaslt.NvblasltError):
                note(f"{label}: the framework's own error, not an NvblasltError: {type(exc).__name__}")
    note(f"under pressure: {outcomes}")
    del hog
    gc.collect()
    torch.cuda.empty_cache()
    d = nvblaslt.matmul(a, b)
    sync()
    close("after freeing memory (rows)", d[rows], ref, terms, "float32", n)
    note("after freeing: matmul works and is right")


def _plan_and_execute(a, b):
    import nvblaslt

    with nvblaslt.Matmul(a, b) as mm:
        mm.plan()
        return mm.execute()


# ---- values: NaN/Inf, degenerate shapes, huge K ---------------------------------------------------------------------
def _ieee_matmul(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """A @ B summed term by term (no BLAS shortcuts), so NaN/Inf follow IEEE rules."""
    with np.errstate(all="ignore"):
        return (A[..., :, :, None] * B[..., None, :, :]).sum(axis=-2)


@case()
def nan_inf_propagate():
    """NaN and ±Inf in the inputs: the result's NaN/Inf pattern is NumPy's (DEFAULT and BIAS)."""
    torch = _torch()
    import nvblaslt

    M, N, K = 48, 40, 32
    rng = rng_for("nan")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for epilog in (None, "BIAS"):
            A, B = rng.standard_normal((M, K)), rng.standard_normal((K, N))
            A[rng.integers(0, M, 3), rng.integers(0, K, 3)] = np.nan
            B[rng.integers(0, K, 2), rng.integers(0, N, 2)] = np.inf
            B[rng.integers(0, K, 2), rng.integers(0, N, 2)] = -np.inf
            bias = rng.standard_normal(M)
            bias[rng.integers(0, M, 2)] = np.nan
            a = torch.from_numpy(A).to(dtype).cuda()
            b = torch.from_numpy(B).to(dtype).cuda()
            bb = torch.from_numpy(bias).to(dtype).cuda()
            ref = _ieee_matmul(host_exact(a), host_exact(b))
            if epilog:
                ref = ref + host_exact(bb)[:, None]
            kwargs = {"epilog": epilog, "epilog_inputs": {"bias": bb}} if epilog else {}
            d = host_exact(nvblaslt.matmul(a, b, **kwargs))
            sync()
            what = f"{dtype_of(a)} {epilog or 'DEFAULT'}"
            for name, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
                if not np.array_equal(test(d), test(ref)):
                    raise Wrong(f"{what}: {name} pattern differs from NumPy's in "
                                f"{int((test(d) != test(ref)).sum())} of {d.size} elements")
            note(f"{what}: NaN/Inf pattern as NumPy's ({int(np.isnan(ref).sum())} NaN, "
                 f"{int(np.isinf(ref).sum())} Inf)")


@case()
def degenerate_shapes():
    """K=0 (nvmath-python refuses it), empty M or N, 1×1×1: right or refused, never a crash or garbage."""
    _torch()
    import nvblaslt

    for label, (m, k, n) in (("K=0", (8, 0, 6)), ("M=0", (0, 4, 6)), ("N=0", (8, 4, 0)), ("1x1x1", (1, 1, 1)),
                             ("M=0,K=0", (0, 0, 5))):
        a, b = rnd((m, k)), rnd((k, n))
        c = rnd((m, n))
        for with_c in (False, True):
            ref = _ieee_matmul(host_exact(a), host_exact(b)) + (0.5 * host_exact(c) if with_c else 0)
            terms = np.abs(host_exact(a)) @ np.abs(host_exact(b)) + (0.5 * np.abs(host_exact(c)) if with_c else 0)
            kwargs = {"beta": 0.5} if with_c else {}
            refused_or(f"{label}{' with c' if with_c else ''}",
                       lambda a=a, b=b, c=c, with_c=with_c, kwargs=kwargs: nvblaslt.matmul(
                           a, b, c if with_c else None, **kwargs),
                       lambda d, ref=ref, terms=terms, label=label: close(label, d, ref, terms, "float32", 1))
        for epilog in ("RELU_AUX", "BGRADB"):
            refused_or(f"{label} {epilog}", lambda a=a, b=b, epilog=epilog: nvblaslt.matmul(a, b, epilog=epilog),
                       lambda r, m=m, n=n, label=label: _check_empty_shapes(label, r, m, n))


def _check_empty_shapes(label, result, m, n):
    d = split(result)[0]
    if tuple(d.shape) != (m, n):
        raise Wrong(f"{label}: D shape {tuple(d.shape)}, expected {(m, n)}")


@case(timeout=120)
def huge_k():
    """1 × 2**24 × 1 in fp32 (and a 2 × 2**22 × 3 batch of it) against float64, within a Σ|terms| bound."""
    _torch()
    import nvblaslt

    rng = rng_for("hugek")
    for m, k, n in ((1, 1 << 24, 1), (2, 1 << 22, 3)):
        a, b = rnd((m, k), rng=rng), rnd((k, n), rng=rng)
        A, B = host_exact(a), host_exact(b)
        ref, terms = A @ B, np.abs(A) @ np.abs(B)
        d = host_exact(nvblaslt.matmul(a, b))
        err = np.abs(d - ref)
        bound = 2.0**-19 * terms  # ~10× a sequential fp32 sum's error at this K; a dropped block is far beyond
        if not (np.isfinite(d).all() and (err <= bound).all()):
            raise Wrong(f"{m}×{k}×{n}: error {err.max():.3g}, bound {bound.min():.3g} (Σ|terms| {terms.max():.3g})")
        note(f"{m}×{k}×{n}: error {err.max():.3g} = {float((err / terms).max()):.2g}·Σ|terms|")


# ---- strides, aliasing ------------------------------------------------------------------------------------------
@case()
def odd_strides():
    """Zero strides (torch.expand, CuPy stride tricks), negative strides (CuPy/NumPy [::-1]), non-unit inner
    strides: right or refused; batch broadcast by expand (valid in nvmath-python) must be right."""
    _torch()
    import nvblaslt

    M, N, K, B = 24, 16, 12, 3
    cases = {
        "a expanded (0, 1)": (rnd((1, K)).expand(M, K), rnd((K, N))),
        "b expanded (1, 0)": (rnd((M, K)), rnd((K, 1)).expand(K, N)),
        "a batch expanded (0, K, 1)": (rnd((1, M, K)).expand(B, M, K), rnd((B, K, N))),
        "b batch expanded": (rnd((B, M, K)), rnd((1, K, N)).expand(B, K, N)),
        "a every other column": (rnd((M, 2 * K))[:, ::2], rnd((K, N))),
        "b every other row": (rnd((M, K)), rnd((2 * K, N))[::2]),
    }
    for label, (a, b) in cases.items():
        z, terms = forward_reference(a, b)
        must = "batch expanded" in label or label == "b every other row"  # valid layouts in nvmath-python
        call = (lambda a=a, b=b: nvblaslt.matmul(a, b))
        check = (lambda d, z=z, terms=terms, label=label: close(label, d, z, terms, "float32", K))
        if must:
            d = call()
            sync()
            check(d)
            note(f"{label}: correct")
        else:
            refused_or(label, call, check)
    with contextlib.suppress(ImportError):
        import cupy

        a, b = cupy.asarray(RNG.standard_normal((M, K)), dtype=np.float32), cupy.asarray(
            RNG.standard_normal((K, N)), dtype=np.float32)
        for label, (x, y) in {"cupy a[::-1]": (a[::-1], b), "cupy b[:, ::-1]": (a, b[:, ::-1]),
                              "cupy zero strides": (cupy.lib.stride_tricks.as_strided(a, (M, K), (0, 4)), b)}.items():
            z, terms = forward_reference(x, y)
            refused_or(label, lambda x=x, y=y: nvblaslt.matmul(x, y),
                       lambda d, z=z, terms=terms, label=label: close(label, d, z, terms, "float32", K))
    A = RNG.standard_normal((M, K)).astype(np.float32)
    Bn = RNG.standard_normal((K, N)).astype(np.float32)
    z, terms = forward_reference(A[::-1], Bn)
    refused_or("numpy a[::-1] (host)", lambda: nvblaslt.matmul(A[::-1], Bn),
               lambda d: close("numpy a[::-1]", d, z, terms, "float32", K))


@case()
def aliasing():
    """out= overlapping an input is refused; out=c (in place) and options inplace=True are right."""
    torch = _torch()
    import nvblaslt

    n = 32
    a, b, c = rnd((n, n), layout="col"), rnd((n, n), layout="col"), rnd((n, n), layout="col")
    z, terms = forward_reference(a, b)
    _must_refuse("out=a", lambda: nvblaslt.matmul(a, b, out=a))
    _must_refuse("out=b", lambda: nvblaslt.matmul(a, b, out=b))
    buffer = torch.empty(3 * n * n, device="cuda")
    x = buffer[: n * n].view(n, n)
    x.copy_(a)
    overlapping = buffer[n * n // 2: n * n // 2 + n * n].view(n, n).t()
    _must_refuse("out= half over a", lambda: nvblaslt.matmul(x, b, out=overlapping))
    bias_buffer = torch.empty(n * n + n, device="cuda")
    bias = bias_buffer[:n]
    bias.copy_(rnd((n,)))
    _must_refuse("out= over the bias", lambda: nvblaslt.matmul(a, b, epilog="BIAS", epilog_inputs={"bias": bias},
                                                              out=bias_buffer[:n * n].view(n, n).t()))
    zc, termsc = forward_reference(a, b, c=c, beta=0.5)
    refused_or("out=c (in place)", lambda: nvblaslt.matmul(a, b, c, beta=0.5, out=c),
               lambda d: close("out=c", c, zc, termsc, "float32", n))
    c2 = rnd((n, n), layout="col")
    zc2, termsc2 = forward_reference(a, b, c=c2, beta=0.5)

    def check_inplace(d):
        if d is not c2:
            note("options inplace=True: the result is not c itself (nvmath-python returns c)")
        close("inplace=True", c2, zc2, termsc2, "float32", n)
    refused_or("options inplace=True", lambda: nvblaslt.matmul(a, b, c2, beta=0.5, options={"inplace": True}),
               check_inplace)
    del z, terms


# ---- the tuning cache -----------------------------------------------------------------------------------------------
_CHILD = r"""
import json, os, sys, warnings
import numpy as np
import torch, nvblaslt
from tests.reference import host_exact
warnings.simplefilter("always")
shapes = {shapes!r}
for m, n, k in shapes:
    g = np.random.default_rng(m * 1000 + n * 10 + k)
    a = torch.from_numpy(g.standard_normal((m, k))).float().cuda()
    b = torch.from_numpy(g.standard_normal((k, n))).float().cuda()
    bias = torch.from_numpy(g.standard_normal(m)).float().cuda()
    with nvblaslt.Matmul(a, b) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={{"bias": bias}})
        if {search!r}:
            mm.autotune(iterations=2, search=True)
        d = mm.execute()
    torch.cuda.synchronize()
    ref = np.maximum(host_exact(a) @ host_exact(b) + host_exact(bias)[:, None], 0)
    terms = np.abs(host_exact(a)) @ np.abs(host_exact(b)) + np.abs(host_exact(bias))[:, None]
    err = np.abs(host_exact(d) - ref)
    if not (err <= 1e-5 * terms + 1e-6).all():
        print(json.dumps({{"wrong": f"{{m}}x{{k}}x{{n}}: error {{err.max()}}"}}))
        sys.exit(3)
print(json.dumps({{"ok": True}}))
"""


def _cache_child(cache_dir, shapes, search: bool, env_changes=None, timeout=60):
    env = dict(os.environ)
    env.pop("XDG_CACHE_HOME", None)
    if cache_dir is not None:
        env["NVBLASLT_CACHE_DIR"] = str(cache_dir)
    for key, value in (env_changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    code = _CHILD.format(shapes=shapes, search=search)
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "hang", ""
    if done.returncode == 3:
        return "wrong", done.stdout.strip()
    if done.returncode != 0:
        return "error", (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    warned = "TuningCacheWarning" in done.stderr or "tuning cache" in done.stderr.lower()
    return "ok" + (" (warned)" if warned else ""), ""


def _read_entries(path):
    with open(path) as f:
        document = json.load(f)
    if isinstance(document, dict) and isinstance(document.get("entries"), dict):
        return document, document["entries"]
    return document, document if isinstance(document, (dict, list)) else {}


_SHAPE = [(48, 40, 32)]


@case(timeout=240)
def tuning_cache_corruption():
    """A tuning.json holding a list, null, a string, entries of the wrong kind, garbage bytes, a FIFO, a
    directory, an unreadable file, a symlink, a huge file, or bad algorithm bytes: plan() and
    autotune(search=True) still work, and results are right."""
    _torch()  # the children use torch
    root = tempfile.mkdtemp(prefix="nvblaslt-stress-cache-")
    try:
        forms = {
            "list": b"[]", "null": b"null", "string": b'"tuning"', "number": b"42",
            "entries-list": json.dumps({"format": "nvblaslt-tuning-cache", "version": 1, "entries": [1, 2]}).encode(),
            "entry-not-dict": json.dumps({"format": "nvblaslt-tuning-cache", "version": 1,
                                          "entries": {"x": 5, "y": [1]}}).encode(),
            "future-version": json.dumps({"format": "nvblaslt-tuning-cache", "version": 99, "entries": {}}).encode(),
            "garbage": bytes(RNG.integers(0, 256, 4096, dtype=np.uint8)), "truncated": b'{"entries": {"a": {"al',
            "huge": b" " * (20 << 20) + b"{}", "fifo": None, "directory": None, "unreadable": b"{}", "symlink": None,
        }
        results, lock = {}, threading.Lock()

        def one(name, content):
            directory = os.path.join(root, name)
            os.makedirs(directory)
            path = os.path.join(directory, "tuning.json")
            if name == "fifo":
                os.mkfifo(path)
            elif name == "directory":
                os.makedirs(path)
            elif name == "symlink":  # to a valid-looking file elsewhere (never /dev/zero: an unguarded read
                target = os.path.join(directory, "elsewhere.json")  # of it would fill the machine's memory)
                with open(target, "w") as f:
                    f.write("{}")
                os.symlink(target, path)
            else:
                with open(path, "wb") as f:
                    f.write(content)
                if name == "unreadable":
                    os.chmod(path, 0)
            outcome = _cache_child(directory, _SHAPE, search=True)
            with lock:
                results[name] = outcome
        threads = [threading.Thread(target=one, args=item) for item in forms.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # bad algorithm bytes in an otherwise valid cache, for the very problem being planned
        directory = os.path.join(root, "algo-bytes")
        os.makedirs(directory)
        created = _cache_child(directory, _SHAPE, search=True)
        path = os.path.join(directory, "tuning.json")
        if created[0].startswith("ok") and os.path.isfile(path):
            with open(path) as f:
                text = f.read()
            hexes = re.findall(r'"([0-9a-fA-F]{64,})"', text)
            for variant, replace in (("algo-random", lambda h: "".join(RNG.choice(list("0123456789abcdef"), len(h)))),
                                     ("algo-zeros", lambda h: "0" * len(h)), ("algo-not-hex", lambda h: "zz" * 8)):
                bad = text
                for h in hexes:
                    bad = bad.replace(h, replace(h))
                with open(path, "w") as f:
                    f.write(bad)
                results[variant] = _cache_child(directory, _SHAPE, search=False)
            if not hexes:
                note("no hex algorithm bytes found in the cache file: the algo-bytes variants changed nothing")
        else:
            results["algo-bytes (creating the cache)"] = created
        failures = {k: v for k, v in results.items() if not v[0].startswith("ok")}
        note("outcomes: " + ", ".join(f"{k}: {v[0]}" for k, v in sorted(results.items())))
        if failures:
            wrong = {k: v for k, v in failures.items() if v[0] == "wrong"}
            message = "; ".join(f"{k}: {v[0]} {v[1]}"[:200] for k, v in sorted(failures.items()))
            if wrong:
                raise Wrong(message)
            raise RuntimeError(message)
    finally:
        for directory, _dirs, files in os.walk(root):
            for f in files:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(directory, f), 0o600)
        shutil.rmtree(root, ignore_errors=True)


@case(timeout=180)
def tuning_cache_unwritable():
    """An unwritable cache directory, and no HOME at all: autotune(search=True) still finishes (one warning)."""
    _torch()  # the children use torch
    root = tempfile.mkdtemp(prefix="nvblaslt-stress-ro-")
    try:
        locked = os.path.join(root, "locked")
        os.makedirs(locked)
        os.chmod(locked, stat.S_IRUSR | stat.S_IXUSR)
        if os.geteuid() == 0:
            note("running as root: a read-only directory is still writable, so that variant proves little")
        not_a_directory = os.path.join(root, "file-not-dir")
        with open(not_a_directory, "w"):
            pass
        outcomes = {"read-only dir": _cache_child(locked, _SHAPE, search=True),
                    "no HOME": _cache_child(None, _SHAPE, search=True, env_changes={"HOME": None,
                                                                                    "NVBLASLT_CACHE_DIR": None}),
                    "dir is a file": _cache_child(not_a_directory, _SHAPE, search=True)}
        note("outcomes: " + ", ".join(f"{k}: {v[0]}" for k, v in outcomes.items()))
        failures = {k: v for k, v in outcomes.items() if not v[0].startswith("ok")}
        if failures:
            raise RuntimeError("; ".join(f"{k}: {v[0]} {v[1]}"[:200] for k, v in failures.items()))
    finally:
        os.chmod(os.path.join(root, "locked"), 0o700)
        shutil.rmtree(root, ignore_errors=True)


@case(timeout=300)
def tuning_cache_concurrent_writers():
    """Six processes run autotune(search=True) on six distinct tiny problems into one cache at the same time:
    afterwards the file is valid JSON, private, holds all six entries, and leaves no temporary files."""
    _torch()  # the children use torch
    root = tempfile.mkdtemp(prefix="nvblaslt-stress-writers-")
    try:
        shapes = [(16 * (i + 1), 24 + 8 * i, 32) for i in range(6)]
        start_at = time.time() + 12  # every child starts its search at the same moment, imports done
        children = []
        for shape in shapes:
            env = dict(os.environ, NVBLASLT_CACHE_DIR=root)
            env.pop("XDG_CACHE_HOME", None)
            code = _CHILD.format(shapes=[shape], search=True).replace(
                "warnings.simplefilter(\"always\")",
                f"warnings.simplefilter(\"always\"); time.sleep(max(0, {start_at} - time.time()))")
            children.append(subprocess.Popen(
                [sys.executable, "-c", "import time\n" + code], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
        failures = []
        for child, shape in zip(children, shapes):
            try:
                out, err = child.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                child.kill()
                failures.append(f"{shape}: hang")
                continue
            if child.returncode != 0:
                failures.append(f"{shape}: exit {child.returncode}: {(err.strip().splitlines() or [''])[-1][:200]}")
        path = os.path.join(root, "tuning.json")
        if not os.path.isfile(path):
            raise RuntimeError(f"no cache file after six writers ({os.listdir(root)}); {failures}")
        try:
            document, entries = _read_entries(path)
        except ValueError as exc:
            raise RuntimeError(f"the cache is not valid JSON after concurrent writes: {exc}") from exc
        mode = stat.S_IMODE(os.stat(path).st_mode)
        leftovers = [f for f in os.listdir(root) if f not in ("tuning.json",) and not f.endswith(".lock")]
        note(f"{len(entries)} entries, mode {oct(mode)}, other files {leftovers}")
        if failures:
            raise RuntimeError("; ".join(failures))
        problems = []
        if len(entries) < len(shapes):
            problems.append(f"{len(entries)} entries after {len(shapes)} writers: lost {len(shapes) - len(entries)}")
        if mode & 0o077:
            problems.append(f"the cache file is readable or writable by others (mode {oct(mode)})")
        if leftovers:
            problems.append(f"temporary files left behind: {leftovers}")
        if problems:
            raise RuntimeError("; ".join(problems))
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---- every array package ---------------------------------------------------------------------------------------------
@case()
def array_packages():
    """CuPy, torch, JAX and Numba arrays, and objects exporting only DLPack or only the CUDA array interface:
    right, and returned in the caller's package."""
    torch = _torch()
    import nvblaslt

    M, N, K = 32, 24, 16
    A, B = RNG.standard_normal((M, K)).astype(np.float32), RNG.standard_normal((K, N)).astype(np.float32)
    z, terms = A.astype(float) @ B.astype(float), np.abs(A.astype(float)) @ np.abs(B.astype(float))
    inputs = {"torch": (torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda())}
    with contextlib.suppress(ImportError):
        import cupy

        ca, cb = cupy.asarray(A), cupy.asarray(B)
        inputs["cupy"] = (ca, cb)

        class OnlyCAI:
            def __init__(self, x):
                self.x = x
                self.__cuda_array_interface__ = x.__cuda_array_interface__

        class OnlyDLPack:
            def __init__(self, x):
                self.x = x

            def __dlpack__(self, **kwargs):
                return self.x.__dlpack__(**kwargs)

            def __dlpack_device__(self):
                return self.x.__dlpack_device__()
        inputs["CAI-only object"] = (OnlyCAI(ca), OnlyCAI(cb))
        inputs["DLPack-only object"] = (OnlyDLPack(ca), OnlyDLPack(cb))
    with contextlib.suppress(Exception):
        import jax.numpy as jnp

        inputs["jax"] = (jnp.asarray(A), jnp.asarray(B))
    with contextlib.suppress(Exception):
        from numba import cuda as numba_cuda

        inputs["numba"] = (numba_cuda.to_device(A), numba_cuda.to_device(B))
    for label, (a, b) in inputs.items():
        d = nvblaslt.matmul(a, b)
        sync()
        with contextlib.suppress(Exception):
            d.block_until_ready()
        close(label, np.asarray(d.copy_to_host()) if hasattr(d, "copy_to_host") else d, z, terms, "float32", K)
        note(f"{label}: right, result a {type(d).__module__}.{type(d).__name__}")


def main(name: str) -> int:
    function, _timeout, _exclusive = CASES[name]
    try:
        function()
    except Skip as exc:
        print(json.dumps({"status": "skip", "detail": str(exc)}), flush=True)
        return 0
    except Wrong as exc:
        print(json.dumps({"status": "wrong", "detail": str(exc)[:2000]}), flush=True)
        return 3
    except BaseException as exc:  # noqa: BLE001 — the parent wants the reason, not a traceback only
        import traceback

        tail = traceback.format_exc().strip().splitlines()[-6:]
        print(json.dumps({"status": "error", "detail": f"{type(exc).__name__}: {exc}"[:2000], "where": tail}),
              flush=True)
        return 1
    print(json.dumps({"status": "pass"}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        for key, (function, timeout, exclusive) in CASES.items():
            print(f"{key:34s} {timeout:4.0f}s{' exclusive' if exclusive else ''}  {function.__doc__.splitlines()[0]}")
        sys.exit(0)
    sys.exit(main(sys.argv[1]))
