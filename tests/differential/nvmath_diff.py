"""Differential test against nvmath-python 1.0 (issue 9): random cases over the whole input space,
each run through ``nvmath.linalg.advanced`` and ``nvblaslt`` with only the import changed, both
checked against a float64 NumPy reference.

Each case is one of: both ok (both within tolerance of float64, and D's shape, dtype, package and
memory order agree, as do the aux outputs' keys, shapes, dtypes and orders), both refused, a gap
(nvmath-python runs it, nvblaslt refuses or fails), nvblaslt-only (fine, noted), a mismatch (both
ran, metadata differ), or wrong (a library disagrees with float64, NaN included). Cases run
in-process with every exception caught; outputs are poisoned (the framework's pool is filled with
NaN bytes first); the data are fresh random numbers (never zeros or ones) from a seed per case.

    python -m tests.differential.nvmath_diff [--cases N] [--seed S] [--only GROUP[,GROUP]]
        [--frameworks cupy,torch,numpy] [--log FILE] [--case I] [--verbose]      # from the repository root
    python -m pytest -m differential tests      # the smoke subset (test_differential.py) and the CPU self-test

nvmath-python is imported from the environment or, failing that, from $NVMATH_SITE (default
/tmp/site). Groups: dtype layout vector batch epilog aux fp8 host options complex stateful
degenerate refuse, and the buckets of issue 19: conj (torch lazy conjugate views, CPU and CUDA, and
``qualifiers``, every transpose, a plain call of the same shape through ``matmul`` before or after
the conjugate one), inplace (``options={"inplace": True}`` through plan, autotune, execute,
reset_operands, execute: autotune must leave c alone), fp8aux (FP8 with fp8/bf16/fp16 results, D
scale, amax, RELU_AUX/GELU_AUX(_BIAS) aux outputs with their aux type, scale and amax) and refcount
(``sys.getrefcount`` of every operand back where it was after free(), a ``with`` block,
release_operands() or a function-form call; nvmath-python is measured the same way, and a count it
misses too is not held against nvblaslt); host also draws 1-D operands and an in-place c, and stateful
several resets in a row. ``--case I`` reruns one case with tracebacks. The summary
prints one line per group and an overall line. Exit status 1 on any nvblaslt wrong result or
mismatch, 2 when the CUDA context was lost.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import json
import logging
import os
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field

import numpy as np

from tests.reference import (
    dtype_name, element_strides, gelu, gelu_grad, host_bits, package_of, unpack_relu_bits)
from tests.reference import host_exact as _host_exact


def host_exact(x) -> np.ndarray:
    """``reference.host_exact``, always a copy: of a CPU float64/complex128 torch tensor it returns a view of the
    tensor's own memory, which an in-place result would write over (and an input check would never see)."""
    out = _host_exact(x)
    return out.copy() if type(x).__module__.startswith("torch") else out

OMIT = object()  # an argument left out of the call
QUALIFIERS_DTYPE = np.dtype([("structure", object), ("is_conjugate", "<i4")])  # nvmath's matrix_qualifiers_dtype
FLOAT_TYPES = ("float32", "float16", "bfloat16", "float64")
COMPLEX_TYPES = ("complex64", "complex128")
FP8_TYPES = ("float8_e4m3fn", "float8_e5m2")
TORCH_ONLY = ("bfloat16", *FP8_TYPES)
CUDA_NAME = {"float32": "CUDA_R_32F", "float16": "CUDA_R_16F", "bfloat16": "CUDA_R_16BF", "float64": "CUDA_R_64F",
             "complex64": "CUDA_C_32F", "complex128": "CUDA_C_64F", "float8_e4m3fn": "CUDA_R_8F_E4M3",
             "float8_e5m2": "CUDA_R_8F_E5M2"}
# twice the unit roundoff of each storage type: one rounding to it, with a margin
U_OUT = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7, "complex64": 2.0**-23,
         "complex128": 2.0**-52, "float8_e4m3fn": 2.0**-3, "float8_e5m2": 2.0**-2, "uint8": 0.0, "int8": 0.0}
MIN_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float8_e4m3fn": 2.0**-6,
              "float8_e5m2": 2.0**-14}
# (per-term accumulation error, input rounding) by compute type
U_COMPUTE = {"COMPUTE_64F": (2.0**-53, 0.0), "COMPUTE_64F_PEDANTIC": (2.0**-53, 0.0),
             "COMPUTE_32F": (2.0**-24, 0.0), "COMPUTE_32F_PEDANTIC": (2.0**-24, 0.0),
             "COMPUTE_32F_FAST_TF32": (2.0**-24, 2.0**-10), "COMPUTE_32F_FAST_16F": (2.0**-24, 2.0**-10),
             "COMPUTE_32F_FAST_16BF": (2.0**-24, 2.0**-7), "COMPUTE_16F": (2.0**-11, 2.0**-10),
             "COMPUTE_16F_PEDANTIC": (2.0**-11, 2.0**-10), "COMPUTE_32F_EMULATED_16BFX9": (2.0**-24, 2.0**-20),
             "COMPUTE_64F_EMULATED_FIXEDPOINT": (2.0**-50, 2.0**-50)}
EPILOGS = ("RELU", "RELU_AUX", "BIAS", "RELU_BIAS", "RELU_AUX_BIAS", "DRELU", "DRELU_BGRAD", "GELU", "GELU_AUX",
           "GELU_BIAS", "GELU_AUX_BIAS", "DGELU", "DGELU_BGRAD", "BGRADA", "BGRADB")
FORWARD_OF = {"DRELU": "RELU_AUX_BIAS", "DRELU_BGRAD": "RELU_AUX", "DGELU": "GELU_AUX", "DGELU_BGRAD": "GELU_AUX_BIAS"}


GRAD_TYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")


class CaseSkipped(Exception):
    """The harness cannot build this case here (a framework or dtype is missing)."""


class ContextLost(Exception):
    """The CUDA context is unusable: the rest of the run cannot be trusted."""


class HarnessError(Exception):
    """The harness itself could not judge a case (a bug here, not in a library)."""


# ---- arrays: a logical value plus how it is laid out in memory ------------------------------------------------
@dataclass
class Arr:
    shape: tuple
    dtype: str
    layout: str = "C"  # C (row-major matrices) or F (column-major matrices, batch axes outermost)
    pad: int = 0  # extra elements in the leading dimension (for 1-D: stride 1 + pad)
    offset: int = 0  # elements from the start of the allocation (0: 256-byte aligned)
    bcast: tuple = ()  # axes with stride 0 (their values repeat)
    conj_view: bool = False  # a torch lazy-conjugate view of the values' conjugate
    values: np.ndarray | None = field(default=None, repr=False)  # logical values, float64 or complex128
    grad: bool = False  # a torch tensor that requires grad (as nn.Linear's parameters do)

    def strides(self) -> tuple:
        nd = len(self.shape)
        if nd == 0:
            return ()
        if nd == 1:
            return (0,) if 0 in self.bcast else (1 + self.pad,)
        inner = list(range(nd - 1, -1, -1)) if self.layout == "C" else [nd - 2, nd - 1, *range(nd - 3, -1, -1)]
        strides, run = [0] * nd, 1
        for i, axis in enumerate(inner):
            if axis in self.bcast:
                continue
            strides[axis] = run
            run *= max(self.shape[axis] + (self.pad if i == 0 else 0), 1)
        return tuple(strides)

    def describe(self) -> str:
        extra = "".join([f"+pad{self.pad}" if self.pad else "", f"@{self.offset}" if self.offset else "",
                         f" bcast{list(self.bcast)}" if self.bcast else "", " conj-view" if self.conj_view else "",
                         " grad" if self.grad else ""])
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "complex64": "c64",
                 "complex128": "c128", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}.get(self.dtype, self.dtype)
        return f"{tuple(self.shape)}{short}{self.layout if len(self.shape) > 1 else ''}{extra}"


def realize(arr: Arr, fw: str):
    """The framework array ``arr`` describes (fresh memory, padding filled with NaN bytes)."""
    strides = arr.strides()
    stored = tuple(1 if i in arr.bcast else n for i, n in enumerate(arr.shape))
    empty = any(n == 0 for n in arr.shape)
    size = arr.offset + (1 if empty else 1 + sum((n - 1) * s for n, s in zip(stored, strides)))
    values = arr.values[tuple(slice(0, 1) if i in arr.bcast else slice(None) for i in range(len(arr.shape)))]
    if arr.conj_view:
        values = np.conj(values)
    if fw in ("torch", "torch_cpu"):
        import torch

        device = "cuda" if fw == "torch" else "cpu"
        dtype = getattr(torch, arr.dtype)
        buffer = torch.empty((size,), dtype=dtype, device=device)
        buffer.view(torch.uint8).fill_(0xFF)
        storage = torch.as_strided(buffer, stored, strides, arr.offset)
        if not empty:
            source = torch.from_numpy(np.ascontiguousarray(values.astype(
                np.complex128 if arr.dtype in COMPLEX_TYPES else np.float64)))
            if arr.dtype in FP8_TYPES:
                source = source.to(torch.float32)
            storage.copy_(source.to(dtype))
        out = torch.as_strided(buffer, tuple(arr.shape), strides, arr.offset)
        if arr.grad:
            out.requires_grad_()
        return out.conj() if arr.conj_view else out
    if arr.dtype in TORCH_ONLY:
        raise CaseSkipped(f"{arr.dtype} needs torch")
    xp = np
    if fw == "cupy":
        import cupy as xp
    dtype = np.dtype(arr.dtype)
    buffer = xp.empty((size,), dtype=dtype)
    buffer.view(np.uint8)[...] = 0xFF
    lib = xp.lib.stride_tricks
    itemsize = dtype.itemsize
    storage = lib.as_strided(buffer[arr.offset:], stored, tuple(s * itemsize for s in strides))
    if not empty:
        storage[...] = xp.asarray(values.astype(dtype))
    return lib.as_strided(buffer[arr.offset:], tuple(arr.shape), tuple(s * itemsize for s in strides))


def scalar_tensor(value: float, form: str, fw: str):
    """A quantization scale as a Python/NumPy number or a one-element float32 array."""
    if form == "py":
        return float(value)
    if form == "np64":
        return np.float64(value)
    if form == "np32":
        return np.float32(value)
    shape = () if form == "tensor0" else (1,)
    if fw in ("torch", "torch_cpu"):
        import torch

        return torch.full(shape, value, dtype=torch.float32, device="cuda" if fw == "torch" else "cpu")
    if fw == "cupy":
        import cupy

        return cupy.full(shape, value, dtype=np.float32)
    return np.full(shape, value, dtype=np.float32)


# ---- a case ------------------------------------------------------------------------------------------------------
@dataclass
class Forward:
    """The forward pass that makes the aux a backward epilog reads."""

    epilog: str
    x: Arr
    w: Arr
    bias: Arr | None = None
    source: str = "same"  # same: each library's own forward; nvmath: nvmath-python's, fed to both


@dataclass
class Case:
    index: int
    group: str
    fw: str
    a: Arr
    b: Arr
    c: Arr | None = None
    alpha: object = OMIT
    beta: object = OMIT
    epilog: str | None = None
    bias: Arr | None = None
    forward: Forward | None = None
    qualifiers: tuple | None = None  # (conj a, conj b, conj c)
    options: dict | None = None  # nvmath field names; type values as dtype/compute names
    options_object: bool = False
    forms: dict = field(default_factory=dict)  # how nvblaslt is given type values (nvmath gets its enums)
    preferences: dict | None = None
    scales: dict | None = None  # key -> (form, value)
    mode: str = "fn"  # fn plan autotune algorithms reset release twice reset_scales
    reset: dict | None = None  # new Arr / values for the reset modes
    mixed_fw: dict | None = None  # operand -> framework, for mixed-package cases
    note: str = ""  # what the case is about, where the fields do not say it
    seq: list | None = None  # mode pair: the matmul() calls in order, each {"ops": case|toggled, "q": qualifiers}
    resets: list | None = None  # modes resets/inplace: reset_operands() calls in a row, each a dict as ``reset``
    aux: dict | None = None  # fp8 aux output: {"type": dtype name|None, "amax": bool, "scale": (form, value)|None}
    end: str = ""  # mode refcount: how the plan ends (fn with with-noplan free release free-after-reset ...)

    def describe(self) -> str:
        parts = [f"{self.group}#{self.index}", self.fw, f"a{self.a.describe()}", f"b{self.b.describe()}"]
        if self.c is not None:
            parts.append(f"c{self.c.describe()}")
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if value is not OMIT:
                parts.append(f"{name}={value!r}" if not isinstance(value, float) else f"{name}={value:.3g}")
        if self.epilog:
            parts.append(self.epilog)
        if self.bias is not None:
            parts.append(f"bias{self.bias.describe()}")
        if self.forward is not None:
            parts.append(f"aux<-{self.forward.epilog}({self.forward.source}, x{self.forward.x.describe()})")
        if self.qualifiers:
            parts.append("conj=" + "".join("abc"[i] for i, q in enumerate(self.qualifiers) if q))
        if self.options:
            parts.append(f"options={self.options}{'(object)' if self.options_object else ''}")
        if self.forms:
            parts.append(f"nvblaslt-forms={self.forms}")
        if self.preferences:
            parts.append(f"preferences={self.preferences}")
        if self.scales:
            parts.append("scales={" + ", ".join(f"{k}: {f}({v:g})" for k, (f, v) in self.scales.items()) + "}")
        if self.mixed_fw:
            parts.append(f"packages={self.mixed_fw}")
        if self.note:
            parts.append(f"[{self.note}]")
        if self.aux:
            aux = [f"type={self.aux['type']}" if self.aux.get("type") else "", "amax" if self.aux.get("amax") else "",
                   f"scale={self.aux['scale'][0]}({self.aux['scale'][1]:g})" if self.aux.get("scale") else ""]
            parts.append("aux{" + (" ".join(x for x in aux if x) or "default type") + "}")
        if self.seq:
            parts.append("seq=" + ",".join(
                ("conj" if s["ops"] == "case" else "plain") + ("" if not s["q"] else "/q" + "".join(
                    "ab"[i] for i, f in enumerate(s["q"][:2]) if f)) for s in self.seq)
                + (" (same storage)" if (self.reset or {}).get("share") else ""))
        if self.resets:
            parts.append("resets=[" + "; ".join(",".join(sorted(r)) for r in self.resets) + "]")
        if self.end:
            parts.append(f"end={self.end}")
        if self.mode != "fn":
            parts.append(f"mode={self.mode}")
        return " ".join(parts)


# ---- generating cases -------------------------------------------------------------------------------------------
class Gen:
    def __init__(self, rng: np.random.Generator, frameworks: tuple[str, ...]):
        self.rng = rng
        self.frameworks = frameworks

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def dim(self, lo=1, hi=40) -> int:
        if self.chance(0.25):
            return self.pick([d for d in (1, 2, 3, 8, 16, 17, 31, 32, 33, 64) if lo <= d <= max(hi, lo)] or [lo])
        return int(self.rng.integers(lo, hi + 1))

    def fw_for(self, dtype: str, host: bool = False) -> str:
        device = [f for f in ("cupy", "torch") if f in self.frameworks]
        hosts = [f for f in ("numpy", "torch_cpu") if f in self.frameworks]
        pool = hosts if host else device
        if not pool and SELF_TEST["on"]:
            pool = hosts  # the self-test runs everything on NumPy
        if dtype in TORCH_ONLY:
            pool = [f for f in pool if f.startswith("torch")]
        if not pool:
            raise CaseSkipped(f"no framework among {self.frameworks} for {dtype}{' on the host' if host else ''}")
        return self.pick(pool)

    def values(self, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
        v = self.rng.standard_normal(shape) * scale
        if dtype in COMPLEX_TYPES:
            v = v + 1j * self.rng.standard_normal(shape) * scale
        if dtype in FP8_TYPES:
            v = np.clip(v, -3.5, 3.5)
        return v

    def arr(self, shape, dtype, layout=None, pad=None, offset=None, bcast=(), scale=1.0, conj_view=False) -> Arr:
        shape = tuple(int(s) for s in shape)
        if layout is None:
            layout = "C" if self.chance(0.5) else "F"
        if pad is None:
            pad = int(self.rng.integers(1, 5)) if self.chance(0.12) else 0
        if offset is None:
            offset = int(self.rng.integers(1, 4)) if self.chance(0.06) else 0
        stored = tuple(1 if i in bcast else n for i, n in enumerate(shape))
        values = np.broadcast_to(self.values(stored, dtype, scale), shape)
        grad = dtype in GRAD_TYPES and self.chance(0.1)  # torch only: other packages ignore it
        return Arr(shape, dtype, layout, pad, offset, tuple(bcast), conj_view, values, grad)

    def vec(self, n, dtype) -> Arr:
        """A contiguous vector (a bias): only its start may be offset."""
        return self.arr((n,), dtype, pad=0)

    def alpha(self, dtype) -> object:
        if self.chance(0.2):
            return OMIT
        if self.chance(0.1):
            return None  # nvmath: 1
        value = float(self.rng.uniform(0.5, 2.0) * self.pick([1, -1]))
        if dtype in COMPLEX_TYPES and self.chance(0.4):
            return complex(value, float(self.rng.uniform(-1, 1)))
        return value

    def beta(self, dtype) -> float | complex:
        value = float(self.rng.uniform(0.25, 1.5) * self.pick([1, -1]))
        if dtype in COMPLEX_TYPES and self.chance(0.3):
            return complex(value, float(self.rng.uniform(-1, 1)))
        return value

    def batch(self, p=0.4, max_dims=2) -> tuple:
        if not self.chance(p):
            return ()
        dims = 1 if max_dims == 1 or self.chance(0.7) else 2
        return tuple(int(self.rng.integers(1, 4)) for _ in range(dims))

    def type_form(self, kind: str) -> str:
        forms = ["same", "int", "name"] + (["dtype-str", "np-dtype", "fw-dtype"] if kind == "dtype" else [])
        return self.pick(forms)


def _c_for(g: Gen, batch, m, n, dtype, p_batch=0.7) -> Arr:
    shape_n = 1 if g.chance(0.15) else n  # (M, 1): broadcast along N
    c_batch = batch if batch and g.chance(p_batch) else ()
    return g.arr((*c_batch, m, shape_n), dtype)


def gen_dtype(g: Gen, index: int) -> Case:
    dtype = g.pick(["float32", "float32", "float16", "bfloat16", "float64", "complex64", "complex128"])
    fw = g.fw_for(dtype)
    m, n, k = g.dim(), g.dim(), g.dim()
    batch = g.batch(0.3, 1)
    case = Case(index, "dtype", fw, g.arr((*batch, m, k), dtype), g.arr((*batch, k, n), dtype), alpha=g.alpha(dtype))
    if g.chance(0.35):
        case.c, case.beta = _c_for(g, batch, m, n, dtype), g.beta(dtype)
    return case


def gen_layout(g: Gen, index: int) -> Case:
    dtype = g.pick(["float32", "float16", "float64", "bfloat16"])
    fw = g.fw_for(dtype)
    m, n, k = g.dim(), g.dim(), g.dim()
    batch = g.batch(0.35, 1)
    a = g.arr((*batch, m, k), dtype, pad=int(g.rng.integers(0, 4)), offset=int(g.pick([0, 0, 0, 1, 2])))
    b = g.arr((*(batch if g.chance(0.8) else ()), k, n), dtype, pad=int(g.rng.integers(0, 4)))
    case = Case(index, "layout", fw, a, b, alpha=g.alpha(dtype))
    if g.chance(0.7):
        c_batch = batch if batch and g.chance(0.6) else ()
        cn = 1 if g.chance(0.2) else n
        case.c = g.arr((*c_batch, m, cn), dtype, pad=int(g.rng.integers(0, 3)))
        case.beta = g.beta(dtype)
        if g.chance(0.15):
            case.options = {"inplace": True}
            case.c = g.arr((*batch, m, n), dtype)
    return case


def gen_vector(g: Gen, index: int) -> Case:
    dtype = g.pick(["float32", "float64", "float16", "complex64"])
    return _vector_case(g, index, "vector", g.fw_for(dtype), dtype)


def _vector_case(g: Gen, index: int, group: str, fw: str, dtype: str, p_c: float = 0.3) -> Case:
    """a 1-D, b 1-D or both (a 1-D a is a row, a 1-D b a column), with c beside a matrix operand."""
    m, n, k = g.dim(), g.dim(), g.dim()
    which = g.pick(["a", "b", "both"])
    batch = g.batch(0.3, 2)
    a = g.arr((k,), dtype, pad=int(g.pick([0, 0, 1]))) if which in ("a", "both") else g.arr((*batch, m, k), dtype)
    b = g.arr((k,), dtype, pad=int(g.pick([0, 0, 1]))) if which in ("b", "both") else g.arr((*batch, k, n), dtype)
    case = Case(index, group, fw, a, b, alpha=g.alpha(dtype))
    case.note = f"1-D {which}"
    if which != "both" and g.chance(p_c):
        mm = 1 if which == "a" else m
        nn = 1 if which == "b" else n
        c_batch = batch if (batch and which != "both" and g.chance(0.5)) else ()
        case.c, case.beta = g.arr((*c_batch, mm, nn), dtype), g.beta(dtype)
    if g.chance(0.2) and dtype not in COMPLEX_TYPES:
        case.epilog = g.pick(["RELU", "GELU"])
    return case


def gen_batch(g: Gen, index: int) -> Case:
    dtype = g.pick(["float32", "float16", "float64", "bfloat16"])
    fw = g.fw_for(dtype)
    m, n, k = g.dim(hi=24), g.dim(hi=24), g.dim(hi=24)
    batch = tuple(int(g.rng.integers(1, 4)) for _ in range(int(g.pick([1, 1, 2, 2, 3]))))
    style = g.pick(["both", "a-only", "b-only", "expand-a", "expand-b"])
    a_batch = batch if style in ("both", "a-only", "expand-b", "expand-a") else ()
    b_batch = batch if style in ("both", "b-only", "expand-a", "expand-b") else ()
    a_bcast = tuple(range(len(batch))) if style == "expand-a" else ()
    b_bcast = tuple(range(len(batch))) if style == "expand-b" else ()
    case = Case(index, "batch", fw, g.arr((*a_batch, m, k), dtype, bcast=a_bcast),
                g.arr((*b_batch, k, n), dtype, bcast=b_bcast), alpha=g.alpha(dtype))
    if g.chance(0.4):
        case.c, case.beta = _c_for(g, batch, m, n, dtype), g.beta(dtype)
    if g.chance(0.35):
        case.epilog = g.pick(["BIAS", "RELU_BIAS", "GELU_BIAS", "RELU"])
        if "BIAS" in case.epilog:
            case.bias = _bias(g, batch, m, dtype)
    return case


def _bias(g: Gen, batch, m, dtype, allow_odd=True) -> Arr:
    shapes = [(m,), (m, 1)]
    if batch:
        shapes += [(*batch, m, 1), (*batch, m, 1)]
        if allow_odd and m > 1:
            shapes.append((*batch, m))  # nvblaslt's own batched form; nvmath-python refuses it
    bias_dtype = dtype
    if dtype in ("float16", "bfloat16") and g.chance(0.25):
        bias_dtype = "float32"  # cuBLASLt takes a float32 bias with 16-bit D
    shape = g.pick(shapes)
    return g.arr(shape, bias_dtype, layout="F" if len(shape) >= 2 else "C", pad=0)


def gen_epilog(g: Gen, index: int) -> Case:
    epilog = g.pick(EPILOGS)
    dtype = g.pick(["float32", "float32", "float16", "bfloat16", "float64"])
    fw = g.fw_for(dtype)
    m, n = g.dim(hi=48), g.dim(hi=48)
    k = g.dim(lo=2 if epilog.startswith("D") else 1, hi=48)
    batch = g.batch(0.35, 2)
    layouts = {"BGRADA": ("F", None), "BGRADB": (None, "C")}.get(epilog, (None, None)) if g.chance(0.6) else (None, None)
    b_batch = batch if g.chance(0.85) else ()
    case = Case(index, "epilog", fw, g.arr((*batch, m, k), dtype, layout=layouts[0]),
                g.arr((*b_batch, k, n), dtype, layout=layouts[1]), epilog=epilog, alpha=g.alpha(dtype))
    if "BIAS" in epilog and "BGRAD" not in epilog:
        case.bias = _bias(g, batch, m, dtype)
    if epilog in FORWARD_OF:
        case.forward = _forward(g, FORWARD_OF[epilog], batch, m, n, dtype)
    if g.chance(0.2):
        case.c, case.beta = _c_for(g, batch, m, n, dtype), g.beta(dtype)
    return case


def _forward(g: Gen, epilog: str, batch, m, n, dtype, source="same") -> Forward:
    kf = g.dim(lo=1, hi=24)
    bias = g.vec(m, dtype) if "BIAS" in epilog else None
    return Forward(epilog, g.arr((*batch, m, kf), dtype), g.arr((kf, n), dtype), bias, source)


def gen_aux(g: Gen, index: int) -> Case:
    backward = g.pick(["DRELU", "DRELU_BGRAD", "DGELU", "DGELU_BGRAD"])
    dtype = g.pick(["float32", "float16", "bfloat16"])
    fw = g.fw_for(dtype)
    m, n, k = g.dim(hi=64), g.dim(hi=48), g.dim(lo=2, hi=32)
    source = g.pick(["same", "same", "nvmath", "2d"])
    batch = g.batch(0.6 if source == "2d" else 0.4, 2) or ((2,) if source == "2d" else ())
    kind = "RELU" if "RELU" in backward else "GELU"
    forward_epilog = g.pick([f"{kind}_AUX", f"{kind}_AUX_BIAS"])
    forward = _forward(g, forward_epilog, () if source == "2d" else batch, m, n, dtype,
                       "same" if source == "2d" else source)
    return Case(index, "aux", fw, g.arr((*batch, m, k), dtype), g.arr((*batch, k, n), dtype), epilog=backward,
                forward=forward, alpha=g.alpha(dtype))


def gen_fp8(g: Gen, index: int) -> Case:
    a_type, b_type = g.pick([("float8_e4m3fn", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e5m2"),
                             ("float8_e5m2", "float8_e4m3fn")])
    fw = g.fw_for(a_type)
    m, n, k = (16 * int(g.rng.integers(1, 5)) for _ in range(3))
    batch = g.batch(0.2, 1)
    case = Case(index, "fp8", fw, g.arr((*batch, m, k), a_type, layout="C", pad=0, offset=0),
                g.arr((*batch, k, n), b_type, layout="F", pad=0, offset=0), alpha=g.alpha("float32"))
    result = g.pick([None, "bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"])
    c_type = None
    if g.chance(0.3):
        c_type = g.pick(["bfloat16", "float16"])
        case.c, case.beta = g.arr((*batch, m, n), c_type, layout="F", pad=0, offset=0), g.beta("float32")
    d_type = result or c_type or a_type
    options = {}
    if result is not None:
        options["result_type"] = result
        case.forms["result_type"] = g.type_form("dtype")
    if d_type in FP8_TYPES and g.chance(0.6):
        options["result_amax"] = True
    case.options = options or None
    forms = ["py", "np64", "np32", "tensor0", "tensor1"]
    scales = {"a": (g.pick(forms), float(g.pick([0.5, 1.0, 2.0, 0.25]))),
              "b": (g.pick(forms), float(g.pick([0.5, 1.0, 2.0])))}
    if d_type in FP8_TYPES:
        scales["d"] = (g.pick(forms), float(g.pick([0.5, 0.25, 1.0])))
    case.scales = scales
    if g.chance(0.25):
        case.epilog = g.pick(["RELU", "BIAS", "GELU"])
        if case.epilog == "BIAS":
            bias_type = d_type if d_type not in FP8_TYPES else (c_type or "float16")
            case.bias = g.vec(m, bias_type)
    if g.chance(0.2):
        case.mode = "reset_scales"
        case.reset = {"scales": {"a": (g.pick(forms), 0.75)}}
    return case


def gen_host(g: Gen, index: int) -> Case:
    dtype = g.pick(["float32", "float64", "float16", "complex64", "bfloat16"])
    fw = g.fw_for(dtype, host=True)
    if g.chance(0.3):  # 1-D host operands (NumPy, CPU torch), with c beside a matrix operand
        case = _vector_case(g, index, "host", fw, dtype, p_c=0.5)
        if g.chance(0.3):
            case.mode = g.pick(["plan", "twice"])
        return case
    if g.chance(0.1):  # a host c updated in place
        m, n, k = g.dim(hi=32), g.dim(hi=32), g.dim(hi=32)
        c = g.arr((m, n), dtype)
        c.grad = False  # a leaf that requires grad cannot be copied into in place
        return Case(index, "host", fw, g.arr((m, k), dtype), g.arr((k, n), dtype), c=c,
                    alpha=g.alpha(dtype), beta=g.beta(dtype), options={"inplace": True},
                    mode=g.pick(["fn", "plan", "autotune"]))
    m, n, k = g.dim(hi=32), g.dim(hi=32), g.dim(lo=2, hi=32)
    batch = g.batch(0.3, 1)
    case = Case(index, "host", fw, g.arr((*batch, m, k), dtype), g.arr((*batch, k, n), dtype), alpha=g.alpha(dtype))
    if g.chance(0.3):
        case.c, case.beta = _c_for(g, batch, m, n, dtype), g.beta(dtype)
    if dtype not in COMPLEX_TYPES and g.chance(0.4):
        case.epilog = g.pick(["RELU_BIAS", "BIAS", "RELU_AUX", "GELU_AUX_BIAS", "DRELU", "BGRADB", "DGELU_BGRAD"])
        if "BIAS" in case.epilog and "BGRAD" not in case.epilog:
            case.bias = g.vec(m, dtype)
        if case.epilog in FORWARD_OF:
            case.forward = _forward(g, FORWARD_OF[case.epilog], batch, m, n, dtype)
    if g.chance(0.3):
        case.options = {"device_id": 0} if g.chance(0.5) else {"blocking": True}
    if g.chance(0.3):
        case.mode = g.pick(["plan", "reset", "release", "resets"])
    if case.mode in ("reset", "release"):  # after release_operands() every operand is given again
        full = 1.0 if case.mode == "release" else 0.0
        case.reset = _reset_spec(g, case, p_a=max(full, 0.7), p_b=max(full, 0.6), p_c=max(full, 0.5),
                                 p_bias=max(full, 0.5), p_alpha=0, p_beta=0)
        if case.mode == "release" and case.forward is not None:
            case.reset["aux"] = True
    elif case.mode == "resets":
        case.resets = [_reset_spec(g, case) for _ in range(int(g.pick([2, 3])))]
    return case


def gen_options(g: Gen, index: int) -> Case:
    dtype = g.pick(["float32", "float32", "float16", "bfloat16", "float64", "complex64"])
    fw = g.fw_for(dtype)
    m, n, k = g.dim(), g.dim(), g.dim()
    case = Case(index, "options", fw, g.arr((m, k), dtype), g.arr((k, n), dtype), alpha=g.alpha(dtype))
    options = {}
    compute = {"float32": ["COMPUTE_32F", "COMPUTE_32F_PEDANTIC", "COMPUTE_32F_FAST_TF32", "COMPUTE_32F_FAST_16F",
                           "COMPUTE_32F_FAST_16BF"],
               "float16": ["COMPUTE_32F", "COMPUTE_32F_PEDANTIC", "COMPUTE_16F"],
               "bfloat16": ["COMPUTE_32F", "COMPUTE_32F_PEDANTIC"],
               "float64": ["COMPUTE_64F", "COMPUTE_64F_PEDANTIC"],
               "complex64": ["COMPUTE_32F", "COMPUTE_32F_FAST_TF32", "COMPUTE_32F_FAST_16F"]}[dtype]
    what = g.pick(["compute", "compute", "scale", "result", "amax", "inplace", "blocking", "alpha-none", "memory"])
    if what == "compute":
        options["compute_type"] = g.pick(compute)
        case.forms["compute_type"] = g.type_form("compute")
    elif what == "scale":
        scale = {"float32": "CUDA_R_32F", "float16": g.pick(["CUDA_R_32F", "CUDA_R_16F"]), "bfloat16": "CUDA_R_32F",
                 "float64": "CUDA_R_64F", "complex64": "CUDA_C_32F"}[dtype]
        options["scale_type"] = scale
        case.forms["scale_type"] = g.pick(["same", "int", "name"])
    elif what == "result":
        options["result_type"] = {"float16": g.pick(["float32", "float16"]), "bfloat16": g.pick(["float32", "bfloat16"]),
                                  }.get(dtype, dtype)
        case.forms["result_type"] = g.type_form("dtype")
    elif what == "amax":
        options["result_amax"] = True  # nvmath-python: fp8 results only
    elif what == "inplace":
        options["inplace"] = True
        case.c, case.beta = g.arr((m, n), dtype), g.beta(dtype)
    elif what == "blocking":
        options["blocking"] = g.pick([True, "auto"])
    elif what == "alpha-none":
        case.alpha = None
    else:
        options["memory_limit"] = g.pick(["50%", "1GiB", 1 << 30])
    case.options = options or None
    case.options_object = bool(options) and g.chance(0.4)
    if g.chance(0.3):
        case.preferences = {"limit": int(g.pick([1, 2, 4, 8]))}
    return case


def gen_complex(g: Gen, index: int) -> Case:
    dtype = g.pick(COMPLEX_TYPES)
    fw = g.fw_for(dtype)
    m, n, k = g.dim(), g.dim(), g.dim()
    batch = g.batch(0.3, 1)
    lazy = fw == "torch" and g.chance(0.3)
    a = g.arr((*batch, m, k), dtype, conj_view=lazy and g.chance(0.5))
    b = g.arr((*batch, k, n), dtype, conj_view=lazy and g.chance(0.5))
    case = Case(index, "complex", fw, a, b, alpha=g.alpha(dtype))
    if g.chance(0.7):
        case.qualifiers = (g.chance(0.5), g.chance(0.5), False)
    if g.chance(0.3):
        case.c, case.beta = _c_for(g, batch, m, n, dtype), g.beta(dtype)
    return case


def gen_stateful(g: Gen, index: int) -> Case:
    dtype = g.pick(["float32", "float16", "bfloat16", "float64", "complex64"])
    fw = g.fw_for(dtype)
    m, n, k = g.dim(), g.dim(), g.dim(lo=2)
    batch = g.batch(0.3, 1)
    case = Case(index, "stateful", fw, g.arr((*batch, m, k), dtype), g.arr((*batch, k, n), dtype),
                alpha=g.alpha(dtype))
    case.mode = g.pick(["plan", "autotune", "algorithms", "reset", "reset", "release", "twice", "resets", "resets"])
    if g.chance(0.4 if case.mode == "resets" else 0.3):
        case.c, case.beta = _c_for(g, batch, m, n, dtype), g.beta(dtype)
    if dtype not in COMPLEX_TYPES and g.chance(0.4):
        case.epilog = g.pick(["RELU_BIAS", "BIAS", "RELU_AUX_BIAS", "GELU", "DRELU", "BGRADA"])
        if "BIAS" in case.epilog:
            case.bias = g.vec(m, dtype)
        if case.epilog in FORWARD_OF:
            case.forward = _forward(g, FORWARD_OF[case.epilog], batch, m, n, dtype)
    if case.mode in ("reset", "release"):
        reset = {"a": dataclasses.replace(case.a, values=g.values(case.a.shape, dtype))}
        if g.chance(0.7) or case.mode == "release":
            reset["b"] = dataclasses.replace(case.b, values=g.values(case.b.shape, dtype))
        if case.c is not None and (g.chance(0.5) or case.mode == "release"):
            reset["c"] = dataclasses.replace(case.c, values=np.broadcast_to(
                g.values(tuple(1 if i in case.c.bcast else s for i, s in enumerate(case.c.shape)), dtype),
                case.c.shape))
        if case.bias is not None and (g.chance(0.5) or case.mode == "release"):
            reset["bias"] = dataclasses.replace(case.bias, values=g.values(case.bias.shape, case.bias.dtype))
        if case.mode == "reset" and g.chance(0.3):
            reset["alpha"] = float(g.rng.uniform(0.5, 1.5))
        if case.mode == "release" and case.forward is not None:
            reset["aux"] = True
        case.reset = reset
    if case.mode == "resets":  # several resets in a row, each followed by execute()
        case.resets = [_reset_spec(g, case) for _ in range(int(g.pick([2, 3, 3, 4])))]
    return case


def _fresh(g: Gen, arr: Arr, scale: float = 1.0, **changes) -> Arr:
    """``arr`` with new random values (its shape, layout and broadcast axes kept)."""
    stored = tuple(1 if i in arr.bcast else s for i, s in enumerate(arr.shape))
    return dataclasses.replace(arr, values=np.broadcast_to(g.values(stored, arr.dtype, scale), arr.shape), **changes)


def _reset_spec(g: Gen, case: Case, p_a=0.7, p_b=0.6, p_c=0.6, p_bias=0.6, p_alpha=0.2, p_beta=0.2,
                scale=1.0) -> dict:
    """One reset_operands() call: new a/b/c/bias values (same layouts), perhaps a new alpha or beta."""
    reset = {}
    if g.chance(p_a):
        reset["a"] = _fresh(g, case.a, scale)
    if g.chance(p_b):
        reset["b"] = _fresh(g, case.b, scale)
    if case.c is not None and g.chance(p_c):
        reset["c"] = _fresh(g, case.c, scale)
    if case.bias is not None and g.chance(p_bias):
        reset["bias"] = _fresh(g, case.bias, scale)
    if g.chance(p_alpha):
        reset["alpha"] = float(g.rng.uniform(0.5, 1.5) * g.pick([1, -1]))
    if case.c is not None and g.chance(p_beta):
        reset["beta"] = float(g.rng.uniform(0.25, 1.5) * g.pick([1, -1]))
    if not reset:
        reset["a"] = _fresh(g, case.a, scale)
    return reset


def gen_degenerate(g: Gen, index: int) -> Case:
    dtype = g.pick(["float32", "float16", "bfloat16"])
    fw = g.fw_for(dtype)
    kind = g.pick(["1x1x1", "M=1", "N=1", "K=1", "outer", "relu_aux-M=1", "gelu_aux-M=1", "bgradb-K=1",
                   "bgrada-N=1", "batch-of-1", "unit-dim-strides"])
    m, n, k = g.dim(), g.dim(), g.dim()
    epilog = None
    if kind == "1x1x1":
        m = n = k = 1
    elif kind == "M=1" or kind in ("relu_aux-M=1", "gelu_aux-M=1"):
        m = 1
        epilog = {"relu_aux-M=1": "RELU_AUX", "gelu_aux-M=1": "GELU_AUX"}.get(kind)
    elif kind == "N=1" or kind == "bgrada-N=1":
        n = 1
        epilog = "BGRADA" if kind == "bgrada-N=1" else None
    elif kind in ("K=1", "outer", "bgradb-K=1"):
        k = 1
        epilog = "BGRADB" if kind == "bgradb-K=1" else None
    batch = (1,) if kind == "batch-of-1" else ()
    a, b = g.arr((*batch, m, k), dtype), g.arr((*batch, k, n), dtype)
    if kind == "unit-dim-strides":  # a (M, 1) and b (1, N) whose unit axes have odd strides
        a, b = g.arr((m, 1), dtype, pad=int(g.rng.integers(1, 5))), g.arr((1, n), dtype, pad=int(g.rng.integers(1, 5)))
    case = Case(index, "degenerate", fw, a, b, epilog=epilog, alpha=g.alpha(dtype))
    if g.chance(0.3) and kind not in ("bgradb-K=1", "bgrada-N=1"):
        case.c, case.beta = g.arr((*batch, a.shape[-2], b.shape[-1]), dtype), g.beta(dtype)
    return case


def gen_refuse(g: Gen, index: int) -> Case:
    """What nvmath-python refuses: nvblaslt should refuse too (or, where it accepts, be right)."""
    dtype = "float32"
    fw = g.fw_for(dtype)
    m, n, k = g.dim(lo=2), g.dim(lo=2), g.dim(lo=2)
    kind = g.pick(["K-mismatch", "batch-mismatch", "c-1-D", "c-without-beta", "conj-c", "mixed-packages",
                   "e5m2xe5m2", "drelu-K=1", "bias-(1,M)", "bias-(M,2)", "K=0", "M=0", "fp8-no-scales",
                   "amax-float32", "fp8-M-not-16", "missing-bias", "inplace-broadcast-c", "int8"])
    a, b = g.arr((m, k), dtype), g.arr((k, n), dtype)
    case = Case(index, "refuse", fw, a, b)
    if kind == "K-mismatch":
        case.b = g.arr((k + 1, n), dtype)
    elif kind == "batch-mismatch":
        case.a, case.b = g.arr((2, m, k), dtype), g.arr((3, k, n), dtype)
    elif kind == "c-1-D":
        case.c, case.beta = g.arr((n,), dtype), 1.0
    elif kind == "c-without-beta":
        case.c = g.arr((m, n), dtype)
    elif kind == "conj-c":
        dtype = "complex64"
        case = Case(index, "refuse", g.fw_for(dtype), g.arr((m, k), dtype), g.arr((k, n), dtype),
                    c=g.arr((m, n), dtype), beta=1.0, qualifiers=(False, False, True))
    elif kind == "mixed-packages":
        others = [f for f in ("numpy", "cupy", "torch") if f in g.frameworks and f != fw]
        if not others:
            raise CaseSkipped("mixed packages need two frameworks")
        case.mixed_fw = {"b": g.pick(others)}
    elif kind == "e5m2xe5m2":
        case = Case(index, "refuse", g.fw_for("float8_e5m2"), g.arr((16, 16), "float8_e5m2", "C", 0, 0),
                    g.arr((16, 16), "float8_e5m2", "F", 0, 0), scales={"a": ("py", 1.0), "b": ("py", 1.0)},
                    options={"result_type": "bfloat16"})
    elif kind == "drelu-K=1":
        case = Case(index, "refuse", fw, g.arr((m, 1), dtype), g.arr((1, n), dtype), epilog="DRELU",
                    forward=_forward(g, "RELU_AUX", (), m, n, dtype))
    elif kind in ("bias-(1,M)", "bias-(M,2)"):
        case.epilog = "BIAS"
        case.bias = g.arr((1, m) if kind == "bias-(1,M)" else (m, 2), dtype)
    elif kind == "K=0":
        case.a, case.b = g.arr((m, 0), dtype), g.arr((0, n), dtype)
    elif kind == "M=0":
        case.a = g.arr((0, k), dtype)
    elif kind == "fp8-no-scales":
        case = Case(index, "refuse", g.fw_for("float8_e4m3fn"), g.arr((16, 32), "float8_e4m3fn", "C", 0, 0),
                    g.arr((32, 16), "float8_e4m3fn", "F", 0, 0), options={"result_type": "bfloat16"})
    elif kind == "amax-float32":
        case.options = {"result_amax": True}
    elif kind == "fp8-M-not-16":
        case = Case(index, "refuse", g.fw_for("float8_e4m3fn"), g.arr((12, 32), "float8_e4m3fn", "C", 0, 0),
                    g.arr((32, 16), "float8_e4m3fn", "F", 0, 0), scales={"a": ("py", 1.0), "b": ("py", 1.0)},
                    options={"result_type": "bfloat16"})
    elif kind == "missing-bias":
        case.epilog = "RELU_BIAS"
    elif kind == "inplace-broadcast-c":
        case.c, case.beta, case.options = g.arr((m, 1), dtype), 1.0, {"inplace": True}
    elif kind == "int8":
        case.a, case.b = g.arr((m, k), "float32"), g.arr((k, n), "float32")
    case.note = kind
    return case


# ---- the buckets of issue 19 -------------------------------------------------------------------------------------
def _weighted_fw(g: Gen, weights: dict) -> str:
    """A framework from those here, drawn with ``weights`` (the self-test has NumPy alone)."""
    pool = [(f, w) for f, w in weights.items() if f in g.frameworks]
    if not pool:
        raise CaseSkipped(f"no framework among {g.frameworks} for this group")
    total = sum(w for _f, w in pool)
    x, run = float(g.rng.random()) * total, 0.0
    for f, w in pool:
        run += w
        if x < run:
            return f
    return pool[-1][0]


def gen_conj(g: Gen, index: int) -> Case:
    """Complex operands that carry a pending conjugation: torch lazy conjugate views (``t.conj()``,
    ``is_conj()`` True; CUDA and CPU tensors), nvmath's ``qualifiers`` (is_conjugate for a and b), or both,
    with row- and column-major a and b. Mode pair calls ``matmul`` twice or three times in a row on the same
    shapes, a plain call beside the conjugate one (the same storage unconjugated, or fresh values), so that
    a cached plan that leaves the conjugation out of its key shows."""
    dtype = g.pick(COMPLEX_TYPES)
    fw = _weighted_fw(g, {"torch": 0.45, "torch_cpu": 0.25, "cupy": 0.15, "numpy": 0.15})
    lazy = fw.startswith("torch")
    m, n, k = g.dim(hi=32), g.dim(hi=32), g.dim(hi=32)
    batch = g.batch(0.2, 1)
    layout_a, layout_b = g.pick([("C", "C"), ("C", "F"), ("F", "C"), ("F", "F")])
    conj_a, conj_b = (lazy and g.chance(0.6)), (lazy and g.chance(0.6))
    if lazy and not (conj_a or conj_b):
        conj_a, conj_b = g.pick([(True, False), (False, True), (True, True)])
    a = g.arr((*batch, m, k), dtype, layout=layout_a, conj_view=conj_a)
    b = g.arr((*(batch if g.chance(0.85) else ()), k, n), dtype, layout=layout_b, conj_view=conj_b)
    case = Case(index, "conj", fw, a, b, alpha=g.alpha(dtype))
    if not lazy or g.chance(0.5):
        case.qualifiers = (g.chance(0.5), g.chance(0.5), False)
        if not lazy and not any(case.qualifiers):
            case.qualifiers = g.pick([(True, False, False), (False, True, False), (True, True, False)])
    if g.chance(0.4):
        case.c, case.beta = _c_for(g, batch, m, n, dtype), g.beta(dtype)
        if lazy and g.chance(0.05):
            case.c.conj_view = True  # nvmath-python refuses a conjugate c; a library that runs it must be right
    case.mode = g.pick(["fn", "fn", "pair", "pair", "pair", "plan", "reset"])
    if case.mode == "pair":
        share = lazy and g.chance(0.5)
        case.reset = {"share": share}
        if lazy and not share:  # the plain call's operands: fresh values in the same layout, no conjugate bit
            for name, arr in (("a", a), ("b", b)):
                if arr.conj_view:
                    case.reset[name] = _fresh(g, arr, conj_view=False)
        q = case.qualifiers
        plain_q = q if lazy else (None if g.chance(0.5) else (not q[0], not q[1], False))
        plain, conj = {"ops": "toggled", "q": plain_q}, {"ops": "case", "q": q}
        case.seq = g.pick([[plain, conj], [plain, conj], [conj, plain], [plain, conj, plain]])
    elif case.mode == "reset":  # new conjugate views (the same conjugate bits: nvmath-python requires them)
        case.reset = _reset_spec(g, case, p_a=0.8, p_b=0.7, p_c=0.5, p_alpha=0, p_beta=0)
    return case


def gen_inplace(g: Gen, index: int) -> Case:
    """``Matmul(a, b, c, beta=…, options={"inplace": True})``: plan, autotune (c must be untouched before
    execute), execute (the result is c), then one to three ``reset_operands`` with new a/b/c/bias values
    (or c left as it is, holding the previous result), each followed by execute."""
    dtype = g.pick(["float32", "float32", "float64", "float16", "bfloat16", "complex64"])
    fw = g.fw_for(dtype, host=g.chance(0.25))
    m, n, k = g.dim(hi=48), g.dim(hi=48), g.dim(hi=48)
    batch = g.batch(0.25, 1)
    a = g.arr((*batch, m, k), dtype)
    b = g.arr((*(batch if g.chance(0.85) else ()), k, n), dtype)
    c = g.arr((*batch, m, n), dtype, offset=0)  # in place: c is never broadcast
    c.grad = False  # a leaf that requires grad cannot be copied into in place
    case = Case(index, "inplace", fw, a, b, c=c, alpha=g.alpha(dtype), beta=g.beta(dtype),
                options={"inplace": True}, mode="inplace")
    if dtype not in COMPLEX_TYPES and g.chance(0.2):
        case.epilog = g.pick(["RELU", "BIAS", "RELU_BIAS", "GELU"])
        if "BIAS" in case.epilog:
            case.bias = g.vec(m, dtype)
    if g.chance(0.15):
        case.options["blocking"] = g.pick([True, "auto"])
    case.resets = [_reset_spec(g, case, p_a=0.8, p_b=0.5, p_c=0.5, p_bias=0.4, p_alpha=0.15, p_beta=0.15)
                   for _ in range(int(g.pick([1, 1, 2, 3])))]
    return case


def gen_fp8aux(g: Gen, index: int) -> Case:
    """FP8 operands (torch, a row-major, b column-major, M, N, K multiples of 16) with RELU_AUX/GELU_AUX(_BIAS)
    and fp8, bf16 or fp16 results: D's scale, result_amax, and the GELU aux in its default type (C's, or
    fp16, where D is fp8) or in fp8 (``preferences={"epilog": {"aux_type": …, "aux_amax": …}}`` with
    ``epilog_inputs["aux_quantization_scale"]``); now and then a reset of a and the aux scale."""
    a_type, b_type = g.pick([("float8_e4m3fn", "float8_e4m3fn")] * 4 + [("float8_e4m3fn", "float8_e5m2"),
                                                                         ("float8_e5m2", "float8_e4m3fn")])
    fw = g.fw_for(a_type, host=g.chance(0.15))
    m, n, k = (16 * int(g.rng.integers(1, 5)) for _ in range(3))
    batch = g.batch(0.15, 1)
    # values of 0.5 (clipped to 3.5) keep |D| and the aux well inside e4m3's 448 after every scale below
    a = g.arr((*batch, m, k), a_type, layout="C", pad=0, offset=0, scale=0.5)
    b = g.arr((*batch, k, n), b_type, layout="F", pad=0, offset=0, scale=0.5)
    epilog = g.pick(["GELU_AUX", "GELU_AUX", "GELU_AUX", "GELU_AUX_BIAS", "GELU_AUX_BIAS", "RELU_AUX",
                     "RELU_AUX_BIAS", "GELU", "RELU", "BIAS"])
    case = Case(index, "fp8aux", fw, a, b, epilog=epilog, alpha=float(g.rng.uniform(0.5, 2.0) * g.pick([1, -1])))
    result = g.pick(["float8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn", "float8_e5m2", "bfloat16", "float16", None])
    c_type = None
    if g.chance(0.4):
        c_type = g.pick(["bfloat16", "float16"])
        case.c = g.arr((*batch, m, n), c_type, layout=g.pick(["F", "F", "C"]), pad=0, offset=0, scale=0.5)
        case.beta = float(g.rng.uniform(0.25, 1.5) * g.pick([1, -1]))
        if result in ("bfloat16", "float16"):
            result = c_type  # a 16-bit D has C's type (cuBLASLt's fp8 table)
    d_type = result or c_type or a_type
    inferred_c = c_type or ("float16" if d_type in FP8_TYPES else d_type)
    options = {}
    if result is not None:
        options["result_type"] = result
        case.forms["result_type"] = g.pick(["same", "same", "name", "int"])
    if d_type in FP8_TYPES and g.chance(0.5):
        options["result_amax"] = True
    case.options = options or None
    forms = ["py", "py", "np64", "tensor0", "tensor1"]
    scales = {name: (g.pick(forms), float(g.pick([0.5, 1.0, 2.0]))) for name in "ab"}
    if d_type in FP8_TYPES:
        scales["d"] = (g.pick(forms), float(g.pick([0.25, 0.5, 1.0])))
    case.scales = scales
    if "BIAS" in epilog:
        case.bias = g.vec(m, "float16" if inferred_c == "float16" else "bfloat16")
    if epilog.startswith("GELU_AUX"):
        kind = g.pick(["default", "default", "fp8", "fp8", "fp8", "c-type", "e5m2"])
        aux = {"type": {"default": None, "fp8": "float8_e4m3fn", "c-type": inferred_c, "e5m2": "float8_e5m2"}[kind]}
        if aux["type"] in FP8_TYPES:
            aux["scale"] = (g.pick(["py", "py", "tensor0", "tensor1"]), float(g.pick([0.25, 0.45, 0.5, 1.0, 2.0])))
            aux["amax"] = g.chance(0.5)
        elif g.chance(0.05):
            aux["amax"] = True  # refused: only an fp8 aux has an amax
        case.aux = aux
        case.forms["aux_type"] = g.pick(["same", "same", "name"])
    elif epilog.startswith("RELU_AUX") and g.chance(0.05):
        case.aux = {"type": "float8_e4m3fn", "scale": ("py", 0.5)}  # refused: the ReLU aux is a bitmask
    case.mode = g.pick(["fn", "fn", "fn", "plan", "reset"])
    if case.mode == "reset":  # new a and, for an fp8 aux, a new aux scale (nvmath-python's aux-scale reset)
        case.reset = {"a": _fresh(g, a, 0.5)}
        if case.aux and case.aux.get("scale"):
            case.reset["aux_scale"] = (g.pick(["py", "tensor1"]), float(g.pick([0.25, 0.75, 1.5])))
    return case


REFCOUNT_ENDS = ("fn", "with", "with-noplan", "free", "release", "free-after-reset", "release-after-reset")


def gen_refcount(g: Gen, index: int) -> Case:
    """``sys.getrefcount`` of a, b, c, bias and the aux input (and of reset operands) before a plan and after it
    ends: a function-form ``matmul`` call, a ``with Matmul(…)`` block (planned and executed, or not),
    ``free()`` or ``release_operands()`` (with the plan still alive), after a reset or not; the results'
    values are checked too."""
    dtype = g.pick(["float32", "float32", "float64", "float16", "complex64"])
    fw = g.fw_for(dtype, host=g.chance(0.35))
    m, n, k = g.dim(hi=24), g.dim(hi=24), g.dim(lo=2, hi=24)
    batch = g.batch(0.2, 1)
    case = Case(index, "refcount", fw, g.arr((*batch, m, k), dtype), g.arr((*batch, k, n), dtype),
                alpha=g.alpha(dtype), mode="refcount")
    if g.chance(0.5):
        if g.chance(0.25):
            case.c, case.options = g.arr((*batch, m, n), dtype, offset=0), {"inplace": True}
            case.c.grad = False
        else:
            case.c = _c_for(g, batch, m, n, dtype)
        case.beta = g.beta(dtype)
    if dtype not in COMPLEX_TYPES and g.chance(0.45):
        case.epilog = g.pick(["BIAS", "RELU_BIAS", "GELU_AUX_BIAS", "RELU_AUX", "DRELU", "DGELU"])
        if "BIAS" in case.epilog:
            case.bias = g.vec(m, dtype)
        if case.epilog in FORWARD_OF:
            case.forward = _forward(g, FORWARD_OF[case.epilog], batch, m, n, dtype)
    case.end = g.pick(REFCOUNT_ENDS)
    if "reset" in case.end:
        case.reset = _reset_spec(g, case, p_a=0.9, p_b=0.6, p_c=0.6, p_bias=0.6, p_alpha=0, p_beta=0)
    return case


GROUPS = {"dtype": (gen_dtype, 9), "layout": (gen_layout, 11), "vector": (gen_vector, 6), "batch": (gen_batch, 9),
          "epilog": (gen_epilog, 16), "aux": (gen_aux, 9), "fp8": (gen_fp8, 8), "host": (gen_host, 7),
          "options": (gen_options, 8), "complex": (gen_complex, 6), "stateful": (gen_stateful, 8),
          "degenerate": (gen_degenerate, 6), "refuse": (gen_refuse, 5), "conj": (gen_conj, 8),
          "inplace": (gen_inplace, 6), "fp8aux": (gen_fp8aux, 7), "refcount": (gen_refcount, 6)}


def group_of(seed: int, index: int) -> str:
    """Case ``index``'s group: fixed by the seed alone, so ``--case I`` repeats a case of any run."""
    names = list(GROUPS)
    weights = np.array([GROUPS[name][1] for name in names], dtype=float)
    return names[int(np.random.default_rng([seed, index, 1]).choice(len(names), p=weights / weights.sum()))]


def make_case(seed: int, index: int, frameworks) -> Case:
    rng = np.random.default_rng([seed, index])
    return GROUPS[group_of(seed, index)][0](Gen(rng, frameworks), index)


# ---- the two libraries -------------------------------------------------------------------------------------------
class Library:
    def __init__(self, name: str):
        self.name = name
        if name == "nvmath":
            import nvmath
            from nvmath.linalg import advanced

            self.mod = advanced
            self.Epilog = advanced.MatmulEpilog
            self.Options = advanced.MatmulOptions
            self.ComputeType = advanced.MatmulComputeType
            self.CudaDataType = nvmath.CudaDataType
        else:
            import nvblaslt

            self.mod = nvblaslt
            self.Epilog = nvblaslt.MatmulEpilog
            self.Options = getattr(nvblaslt, "MatmulOptions", None)

    def type_value(self, kind: str, name: str, form: str, fw: str, nvmath_lib: "Library"):
        """A compute/scale/result type as this library is given it."""
        if kind == "compute":
            enum_value = nvmath_lib.ComputeType[name]
        else:
            enum_value = nvmath_lib.CudaDataType[CUDA_NAME.get(name, name)]
        if self.name == "nvmath" or form == "same":
            return enum_value
        if form == "int":
            return int(enum_value)
        if form == "name":
            return enum_value.name
        if form == "dtype-str":
            return name
        if form == "np-dtype":
            return np.dtype(name) if name not in TORCH_ONLY else name
        if form == "fw-dtype":
            if fw.startswith("torch"):
                import torch

                return getattr(torch, name)
            return np.dtype(name) if name not in TORCH_ONLY else name
        raise AssertionError(form)

    def options(self, case: Case, nvmath_lib: "Library"):
        if case.options is None:
            return OMIT
        options = {}
        for key, value in case.options.items():
            if key == "compute_type":
                value = self.type_value("compute", value, case.forms.get(key, "same"), case.fw, nvmath_lib)
            elif key in ("scale_type", "result_type"):
                value = self.type_value("dtype", value, case.forms.get(key, "same"), case.fw, nvmath_lib)
            options[key] = value
        if case.options_object and self.Options is not None:
            return self.Options(**options)
        return options


@dataclass
class Step:
    label: str
    d: object = None
    aux: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)  # host copies the reference is computed from
    returned_c: bool = False  # the result is the very object passed as c (inplace)
    snap: dict = field(default_factory=dict)  # host copies taken at once of outputs a later step overwrites (c)


@dataclass
class Run:
    library: str
    steps: list = field(default_factory=list)
    error: BaseException | None = None
    error_step: str = ""
    traceback: str = ""
    modified_inputs: list = field(default_factory=list)
    phase: str = "setup"
    problems: list = field(default_factory=list)  # wrong besides the values: autotune wrote to c before execute
    leaks: dict = field(default_factory=dict)  # refcount: operand -> references the ended plan still holds
    leak_end: str = ""


def _sync(fw: str) -> None:
    if fw == "torch" or "torch" in sys.modules:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.cuda.Device().synchronize()


_POISON_SIZES = [1 << s for s in range(8, 23, 2)]


def poison(fw: str) -> None:
    """Fill the framework's pool with NaN bytes: a result the library never writes stays NaN."""
    if fw == "torch":
        import torch

        blocks = [torch.empty((n,), dtype=torch.uint8, device="cuda").fill_(0xFF) for n in _POISON_SIZES]
        del blocks
    elif fw == "cupy":
        import cupy

        blocks = [cupy.full((n,), 0xFF, dtype=np.uint8) for n in _POISON_SIZES]
        del blocks


def _realize_all(case: Case, fw: str, prefix: str = "") -> dict:
    env = {}
    for name in ("a", "b", "c", "bias"):
        arr = getattr(case, name)
        if arr is not None:
            env[name] = realize(arr, (case.mixed_fw or {}).get(name, fw))
    if case.note == "int8":
        env["a"], env["b"] = _as_int8(env["a"], fw), _as_int8(env["b"], fw)
    return env


def _as_int8(x, fw):
    if fw.startswith("torch"):
        return x.to(sys.modules["torch"].int8)
    return x.astype(np.int8)


def _scales(case: Case, overrides: dict | None = None) -> dict:
    scales = {k: v for k, v in (case.scales or {}).items()}
    scales.update(overrides or {})
    return scales


def _build_scales(scales: dict, fw: str):
    return {key: scalar_tensor(value, form, fw) for key, (form, value) in scales.items()}


def _split(result):
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result[0], result[1]
    return result, {}


def run_library(lib: Library, case: Case, nvmath_lib: Library, shared: dict) -> Run:
    """Everything ``case`` asks of one library; exceptions are recorded, not raised."""
    run = Run(lib.name)
    fw = case.fw
    env = _realize_all(case, fw)
    originals = dict(env)  # the reset modes rebind env's entries; these must still be untouched at the end
    inputs = {k: host_exact(v) for k, v in env.items()}
    try:
        aux_in = None
        if case.forward is not None:
            run.phase = "forward"
            f = case.forward
            source = nvmath_lib if f.source == "nvmath" else lib
            if f.source == "nvmath" and "nvmath_forward" in shared:
                aux_in, forward_step = shared["nvmath_forward"]
            else:
                fx, fw_w = realize(f.x, fw), realize(f.w, fw)
                kwargs = {"epilog": source.Epilog[f.epilog]}
                fin = {"a": host_exact(fx), "b": host_exact(fw_w)}
                if f.bias is not None:
                    fbias = realize(f.bias, fw)
                    kwargs["epilog_inputs"] = {"bias": fbias}
                    fin["bias"] = host_exact(fbias)
                poison(fw)
                d, aux = _split(source.mod.matmul(fx, fw_w, **kwargs))
                _sync(fw)
                forward_step = Step("forward", d, aux, {**fin, "epilog": f.epilog})
                key = "relu_aux" if "RELU" in f.epilog else "gelu_aux"
                if key not in aux:
                    raise KeyError(f"the forward {f.epilog} returned no '{key}' (keys {sorted(aux)})")
                aux_in = aux[key]
                if f.source == "nvmath":
                    shared["nvmath_forward"] = (aux_in, forward_step)
            if f.source == "same":
                run.steps.append(forward_step)
        run.phase = "call" if case.mode == "fn" else "Matmul"
        kwargs = _call_kwargs(lib, case, env, aux_in, nvmath_lib)
        base_inputs = dict(inputs)
        if aux_in is not None:
            base_inputs["aux"] = aux_in
        base_inputs.update(_reference_params(case, kwargs))
        a, b, c = env["a"], env["b"], env.get("c")
        poison(fw)
        if case.mode == "fn":
            result = lib.mod.matmul(a, b, **({"c": c} if c is not None else {}), **_fresh_call(kwargs["call"]),
                                    **kwargs["plan"])
            _sync(fw)
            d, aux = _split(result)
            run.steps.append(Step("call", d, aux, base_inputs, returned_c=c is not None and d is c))
        elif case.mode == "pair":
            _pair(lib, case, env, kwargs, base_inputs, run)
        elif case.mode == "refcount":
            _refcount(lib, case, env, kwargs, base_inputs, run, aux_in)
        else:
            _stateful(lib, case, env, kwargs, base_inputs, run, nvmath_lib, aux_in)
        run.phase = "inputs check"
        for name, before in inputs.items():  # nothing may write to the inputs (C aside when in place)
            if name == "c" and (case.options or {}).get("inplace"):
                continue
            after = host_exact(originals[name])
            if not np.array_equal(before, after, equal_nan=True):
                run.modified_inputs.append(name)
    except ContextLost:
        raise
    except Exception as exc:  # noqa: BLE001 — a refusal or a failure: recorded and judged
        run.error, run.error_step = exc, run.phase
        run.traceback = traceback.format_exc(limit=12)
        _check_context(exc)
    return run


def _check_context(exc: BaseException) -> None:
    text = f"{type(exc).__name__}: {exc}"
    if re.search(r"illegal (memory )?(access|address)|unspecified launch failure|misaligned address|"
                 r"CUDA_ERROR_ILLEGAL|cudaErrorIllegal|device-side assert|context is destroyed", text, re.I):
        raise ContextLost(text)


def _reference_params(case: Case, kwargs: dict) -> dict:
    scales = {k: v for k, (_form, v) in (case.scales or {}).items()}
    aux = case.aux or {}
    return {"alpha": case.alpha, "beta": case.beta, "epilog": case.epilog, "scales": scales,
            "qualifiers": case.qualifiers or (False, False, False), "options": case.options or {},
            "aux_scale": aux["scale"][1] if aux.get("scale") else None, "aux_amax": bool(aux.get("amax"))}


def _qualifiers(flags) -> np.ndarray:
    q = np.zeros((3,), dtype=QUALIFIERS_DTYPE)
    for i, flag in enumerate(flags):
        q[i]["is_conjugate"] = int(flag)
    return q


def _fresh_call(call: dict) -> dict:
    """Constructor keywords with a qualifiers array of their own: nvmath-python writes into the one it is
    given (it folds a lazy conjugation into it), so no array is passed twice."""
    if "qualifiers" not in call:
        return call
    return dict(call, qualifiers=call["qualifiers"].copy())


def _call_kwargs(lib: Library, case: Case, env: dict, aux_in, nvmath_lib: Library) -> dict:
    """{"call": Matmul/matmul constructor keywords, "plan": plan keywords}."""
    call, plan = {}, {}
    if case.alpha is not OMIT:
        call["alpha"] = case.alpha
    if case.beta is not OMIT:
        call["beta"] = case.beta
    if case.qualifiers is not None:
        call["qualifiers"] = _qualifiers(case.qualifiers)
    options = lib.options(case, nvmath_lib)
    if options is not OMIT:
        call["options"] = options
    if case.scales:
        call["quantization_scales"] = _build_scales(case.scales, case.fw)
    if case.epilog:
        plan["epilog"] = lib.Epilog[case.epilog]
        inputs = {}
        if case.bias is not None:
            inputs["bias"] = env["bias"]
        if aux_in is not None:
            inputs["relu_aux" if "RELU" in case.epilog else "gelu_aux"] = aux_in
        if case.aux and case.aux.get("scale"):
            form, value = case.aux["scale"]
            inputs["aux_quantization_scale"] = scalar_tensor(value, form, case.fw)
        if inputs:
            plan["epilog_inputs"] = inputs
    if case.preferences:
        plan["preferences"] = dict(case.preferences)
    if case.aux and (case.aux.get("type") or case.aux.get("amax")):
        epilog_preferences = {}
        if case.aux.get("type"):
            form = case.forms.get("aux_type", "same")
            epilog_preferences["aux_type"] = lib.type_value("dtype", case.aux["type"], form, case.fw, nvmath_lib)
        if case.aux.get("amax"):
            epilog_preferences["aux_amax"] = True
        plan["preferences"] = dict(plan.get("preferences") or {}, epilog=epilog_preferences)
    return {"call": call, "plan": plan}


def _step(label: str, d, aux: dict, inputs: dict, c, snap: bool = False) -> Step:
    step = Step(label, d, aux, inputs, returned_c=c is not None and d is c)
    if snap:  # in place: the next execute() writes over this result
        step.snap["d"] = host_exact(d)
    return step


def _apply_reset(lib, case: Case, env: dict, mm, reset: dict, prev_inputs: dict, aux_in, fw: str) -> dict:
    """One reset_operands() call as ``reset`` says; the inputs the next execute() computes from."""
    new_inputs, keywords = dict(prev_inputs), {}
    inplace = bool((case.options or {}).get("inplace"))
    for name in ("a", "b", "c"):
        if name in reset:
            env[name] = keywords[name] = realize(reset[name], (case.mixed_fw or {}).get(name, fw))
            new_inputs[name] = host_exact(env[name])
    if inplace and "c" not in reset and "c" in env:
        new_inputs["c"] = host_exact(env["c"])  # c kept: it holds the previous result now
    if "bias" in reset:
        env["bias"] = realize(reset["bias"], fw)
        new_inputs["bias"] = host_exact(env["bias"])
        keywords["epilog_inputs"] = {"bias": env["bias"]}
    if reset.get("aux"):
        keywords.setdefault("epilog_inputs", {})["relu_aux" if "RELU" in case.epilog else "gelu_aux"] = aux_in
    if "aux_scale" in reset:
        form, value = reset["aux_scale"]
        keywords.setdefault("epilog_inputs", {})["aux_quantization_scale"] = scalar_tensor(value, form, fw)
        new_inputs["aux_scale"] = value
    for name in ("alpha", "beta"):
        if name in reset:
            keywords[name] = reset[name]
            new_inputs[name] = reset[name]
    if case.mode == "reset_scales" or (case.mode == "release" and case.scales):
        scales = _scales(case, reset.get("scales"))
        keywords["quantization_scales"] = _build_scales(scales, fw)
        new_inputs["scales"] = {k: v for k, (_form, v) in scales.items()}
    if case.mode == "release":
        mm.release_operands()
    mm.reset_operands(**keywords)
    return new_inputs


def _stateful(lib, case, env, kwargs, base_inputs, run, nvmath_lib, aux_in) -> None:
    fw = case.fw
    a, b, c = env["a"], env["b"], env.get("c")
    inplace = bool((case.options or {}).get("inplace"))
    mm = lib.mod.Matmul(a, b, **({"c": c} if c is not None else {}), **_fresh_call(kwargs["call"]))
    try:
        run.phase = "plan"
        algorithms = mm.plan(**kwargs["plan"])
        if case.mode in ("autotune", "inplace"):
            run.phase = "autotune"
            mm.autotune(iterations=2)
            _sync(fw)
            if inplace and c is not None and not np.array_equal(host_exact(c), base_inputs["c"], equal_nan=True):
                run.problems.append("autotune: wrote to c before execute() (in place)")
        if case.mode == "algorithms":
            run.phase = "plan(algorithms=…)"
            chosen = list(algorithms)[:2]
            other = lib.mod.Matmul(a, b, **({"c": c} if c is not None else {}), **_fresh_call(kwargs["call"]))
            try:
                other.plan(algorithms=chosen, **kwargs["plan"])
                d, aux = _split(other.execute())
                _sync(fw)
                run.steps.append(Step("plan(algorithms=…)", d, aux, base_inputs))
            finally:
                other.free()
            return
        run.phase = "execute"
        d, aux = _split(mm.execute())
        _sync(fw)
        run.steps.append(_step("execute", d, aux, base_inputs, c, snap=inplace))
        run.phase = case.mode
        if case.mode == "twice":
            d, aux = _split(mm.execute())
            _sync(fw)
            run.steps.append(_step("execute again", d, aux, base_inputs, c, snap=inplace))
        elif case.mode in ("reset", "release", "reset_scales"):
            new_inputs = _apply_reset(lib, case, env, mm, case.reset or {}, base_inputs, aux_in, fw)
            poison(fw)
            d, aux = _split(mm.execute())
            _sync(fw)
            run.steps.append(_step(f"execute after {case.mode}", d, aux, new_inputs, env.get("c"), snap=inplace))
        elif case.mode in ("resets", "inplace"):
            inputs_now = base_inputs
            for i, reset in enumerate(case.resets or []):
                run.phase = f"reset {i + 1} ({','.join(sorted(reset))})"
                inputs_now = _apply_reset(lib, case, env, mm, reset, inputs_now, aux_in, fw)
                poison(fw)
                run.phase = f"execute after reset {i + 1}"
                d, aux = _split(mm.execute())
                _sync(fw)
                run.steps.append(_step(f"execute after reset {i + 1}", d, aux, inputs_now, env.get("c"), snap=inplace))
    finally:
        mm.free()


def _pair(lib, case: Case, env: dict, kwargs: dict, base_inputs: dict, run: Run) -> None:
    """matmul() calls in a row on the same shapes: the case's operands (conjugate views, qualifiers) and
    'toggled' ones: the same storage with the conjugate bit cleared, or fresh plain tensors; each call with
    the qualifiers ``case.seq`` gives it (a new array each time)."""
    fw = case.fw
    toggled = {}
    for name in ("a", "b"):
        arr = getattr(case, name)
        if not arr.conj_view:
            toggled[name] = env[name]
        elif (case.reset or {}).get("share"):
            toggled[name] = env[name].conj()  # a conjugate view's conj(): the plain tensor on the same memory
        else:
            toggled[name] = realize(case.reset[name], fw)
    c = env.get("c")
    call = {k: v for k, v in kwargs["call"].items() if k != "qualifiers"}
    for i, spec in enumerate(case.seq or []):
        ops = env if spec["ops"] == "case" else toggled
        keywords = dict(call)
        if spec["q"] is not None:
            keywords["qualifiers"] = _qualifiers(spec["q"])
        inputs = dict(base_inputs, a=host_exact(ops["a"]), b=host_exact(ops["b"]),
                      qualifiers=spec["q"] or (False, False, False))
        label = f"{'conjugate' if spec['ops'] == 'case' else 'plain'} call {i + 1}"
        run.phase = label
        poison(fw)
        d, aux = _split(lib.mod.matmul(ops["a"], ops["b"], **({"c": c} if c is not None else {}), **keywords,
                                       **kwargs["plan"]))
        _sync(fw)
        run.steps.append(Step(label, d, aux, inputs))


def _refcounts(objects: dict) -> dict:
    gc.collect()
    return {name: sys.getrefcount(x) for name, x in objects.items()}


def _refcount_reset(mm, new: dict, base_inputs: dict, c, inplace: bool) -> dict:
    """reset_operands() with the new arrays (a function of its own: no local outlives it)."""
    keywords, inputs = {}, dict(base_inputs)
    for name in ("a", "b", "c"):
        if name in new:
            keywords[name] = new[name]
            inputs[name] = host_exact(new[name])
    if inplace and "c" not in new and c is not None:
        inputs["c"] = host_exact(c)
    if "bias" in new:
        keywords["epilog_inputs"] = {"bias": new["bias"]}
        inputs["bias"] = host_exact(new["bias"])
    mm.reset_operands(**keywords)
    return inputs


def _refcount(lib, case: Case, env: dict, kwargs: dict, base_inputs: dict, run: Run, aux_in) -> None:
    """Reference counts of every array handed to the library, before the plan and after it ends as
    ``case.end`` says (measured while the ended Matmul object is still alive); what the results hold (D is
    c in place) is allowed for. Every harness-held reference exists before the first count."""
    fw = case.fw
    objects = {name: env[name] for name in ("a", "b", "c", "bias") if name in env}
    if aux_in is not None:
        objects["aux"] = aux_in
    reset = case.reset or {}
    new = {name: realize(reset[name], fw) for name in ("a", "b", "c", "bias") if name in reset}
    objects.update({f"new {name}": x for name, x in new.items()})
    a, b, c = env["a"], env["b"], env.get("c")
    operands = {"c": c} if c is not None else {}
    call = _fresh_call(kwargs["call"])
    inplace = bool((case.options or {}).get("inplace"))
    end = case.end
    first = len(run.steps)
    before = _refcounts(objects)
    run.phase = end
    if end == "fn":
        run.steps.append(_step("call", *_split(lib.mod.matmul(a, b, **operands, **call, **kwargs["plan"])),
                               base_inputs, c))
        _sync(fw)
        after = _refcounts(objects)
    elif end in ("with", "with-noplan"):
        with lib.mod.Matmul(a, b, **operands, **call) as mm:
            if end == "with":
                mm.plan(**kwargs["plan"])
                run.steps.append(_step("execute", *_split(mm.execute()), base_inputs, c))
                _sync(fw)
        after = _refcounts(objects)  # mm is still bound, as in nvmath-python's test
        del mm
    else:
        mm = lib.mod.Matmul(a, b, **operands, **call)
        freed = False
        try:
            mm.plan(**kwargs["plan"])
            run.steps.append(_step("execute", *_split(mm.execute()), base_inputs, c, snap=inplace))
            _sync(fw)
            if "reset" in end:
                run.phase = f"{end}: reset"
                inputs = _refcount_reset(mm, new, base_inputs, c, inplace)
                run.steps.append(_step("execute after reset", *_split(mm.execute()), inputs, new.get("c", c),
                                       snap=inplace))
                _sync(fw)
                del inputs
            run.phase = end
            if end.startswith("free"):
                mm.free()
                freed = True
            else:
                mm.release_operands()
            after = _refcounts(objects)  # the Matmul object is still alive
        finally:
            if not freed:
                mm.free()
    # what the harness's own new records hold: the results (D is c in place) and a reset step's inputs (a
    # copy of base_inputs, which holds the aux input itself)
    records = [(s.d, *s.aux.values(), *(s.inputs.values() if s.inputs is not base_inputs else ()))
               for s in run.steps[first:]]
    held = {name: sum(1 for r in records for y in r if y is x) for name, x in objects.items()}
    run.leaks = {name: after[name] - held[name] - before[name] for name in objects
                 if after[name] - held[name] != before[name]}
    run.leak_end = end


# ---- the float64 reference ----------------------------------------------------------------------------------------
def _scalar_value(value, default):
    if value is OMIT or value is None:
        return default
    return complex(value) if isinstance(value, complex) else float(value)


def reference(inputs: dict, d_dtype: str, compute: str, aux_dtypes: dict) -> dict:
    """Expected D and aux outputs with elementwise error bounds: {name: (kind, value, bound)}."""
    A, B = inputs["a"], inputs["b"]
    conj = inputs.get("qualifiers", (False, False, False))
    if conj[0] and np.iscomplexobj(A):
        A = np.conj(A)
    if conj[1] and np.iscomplexobj(B):
        B = np.conj(B)
    a_vec, b_vec = A.ndim == 1, B.ndim == 1
    A2 = A[None, :] if a_vec else A
    B2 = B[:, None] if b_vec else B
    scales = inputs.get("scales") or {}
    sa, sb, sc, sd = (scales.get(k, 1.0) for k in "abcd")
    alpha = _scalar_value(inputs.get("alpha"), 1.0)
    c = inputs.get("c")
    beta = _scalar_value(inputs.get("beta"), 1.0 if c is not None else 0.0)
    k = A2.shape[-1]
    product = np.matmul(A2, B2)
    terms = np.matmul(np.abs(A2), np.abs(B2))
    z = alpha * sa * sb * product
    size = abs(alpha * sa * sb) * terms
    if c is not None:
        z = z + beta * sc * c
        size = size + abs(beta * sc) * np.abs(c)
    epilog = inputs.get("epilog") or "DEFAULT"
    bias = inputs.get("bias")
    bias_rounding = 0.0
    if bias is not None and "BIAS" in epilog and "BGRAD" not in epilog:
        column = bias[:, None] if bias.ndim == 1 else (bias if bias.shape[-1] == 1 else bias[..., :, None])
        # cuBLASLt rounds the product to a 16-bit result type before it adds the bias (measured on an H200;
        # nvmath-python's results carry the same error): one more rounding of |product|
        if d_dtype in ("float16", "bfloat16"):
            bias_rounding = 2 * U_OUT[d_dtype] * np.abs(z)
        z = z + column
        size = size + np.abs(column)
    m = z.shape[-2]
    u_acc, u_in = U_COMPUTE.get(compute, U_COMPUTE["COMPUTE_32F"])
    if inputs.get("a_dtype") in FP8_TYPES:
        # Hopper's fp8 MMA accumulates in reduced precision between promotions: measured up to 2.2e-4 of
        # sum|terms| on an H200 (60 random 48x48x48 e4m3 problems), identical for nvmath-python and nvblaslt
        u_in = max(u_in, 2.0**-13)
    if "GELU" in epilog:
        u_in += 2.0**-11  # the kernel's tanh may be the hardware approximation (relative error ~2^-11)
    rel = 4 * (k * u_acc + u_in) + 1e-300

    def bound(scale, value, dtype):
        # plus the smallest normal number: kernels may flush subnormal results to zero
        return (rel * scale + 2 * U_OUT.get(dtype, 2.0**-23) * np.abs(value)
                + 1e-6 * rel * (scale.max() if scale.size else 0) + MIN_NORMAL.get(dtype, 0.0))

    out = {}
    d, d_size = z, size
    if epilog in ("RELU", "RELU_AUX", "RELU_BIAS", "RELU_AUX_BIAS"):
        d = np.maximum(z.real, 0) if not np.iscomplexobj(z) else z
    elif epilog in ("GELU", "GELU_AUX", "GELU_BIAS", "GELU_AUX_BIAS"):
        d, d_size = gelu(z), 1.2 * size
    elif epilog in ("DRELU", "DRELU_BGRAD"):
        mask = unpack_relu_bits(inputs["aux_bits"], m)
        d = z * mask
    elif epilog in ("DGELU", "DGELU_BGRAD"):
        d, d_size = z * gelu_grad(inputs["aux"][..., :m, :]), 1.2 * size
    if "RELU_AUX" in epilog:
        out["relu_aux"] = ("mask", z, bound(size, z, "float32") + bias_rounding)
    if "GELU_AUX" in epilog:
        # an fp8 aux holds aux_quantization_scale * z; its amax is max|z| (or, should cuBLASLt read it after
        # the scale, max|scale * z|: either is accepted, and the two libraries are compared)
        s_aux = inputs.get("aux_scale")
        s_aux = 1.0 if s_aux is None else float(s_aux)
        out["gelu_aux"] = ("pre", s_aux * z, bound(abs(s_aux) * size, s_aux * z, aux_dtypes.get("gelu_aux", d_dtype))
                           + abs(s_aux) * bias_rounding)
        if inputs.get("aux_amax"):
            out["gelu_aux_amax"] = ("amax", np.abs(z).max() if z.size else 0.0, s_aux)
    if epilog in ("DRELU_BGRAD", "DGELU_BGRAD"):
        name = epilog.lower()
        vec = d.sum(axis=-1)
        vec_bound = (rel + 4 * z.shape[-1] * u_acc) * d_size.sum(axis=-1) + 2 * U_OUT.get(
            aux_dtypes.get(name, d_dtype), 2.0**-23) * (np.abs(vec) + d_size.sum(axis=-1))
        out[name] = ("vec", vec, vec_bound)
    batch = np.broadcast_shapes(A2.shape[:-2], B2.shape[:-2])  # a single matrix serves every batch
    if epilog == "BGRADA":
        vec = np.broadcast_to(A2.sum(axis=-1), (*batch, A2.shape[-2]))
        out["bgrada"] = ("vec", [vec, alpha * vec], 4 * k * u_acc * np.abs(A2).sum(axis=-1)
                         + 2 * U_OUT.get(aux_dtypes.get("bgrada", d_dtype), 2.0**-23) * np.abs(A2).sum(axis=-1))
    if epilog == "BGRADB":
        vec = np.broadcast_to(B2.sum(axis=-2), (*batch, B2.shape[-1]))
        out["bgradb"] = ("vec", [vec, alpha * vec], 4 * k * u_acc * np.abs(B2).sum(axis=-2)
                         + 2 * U_OUT.get(aux_dtypes.get("bgradb", d_dtype), 2.0**-23) * np.abs(B2).sum(axis=-2))
    if (inputs.get("options") or {}).get("result_amax"):
        out["result_amax"] = ("amax", np.abs(d).max() if d.size else 0.0, sd)
    if d_dtype in FP8_TYPES:
        d, d_size = sd * d, abs(sd) * d_size
    if a_vec:
        d, d_size = d[..., 0, :], d_size[..., 0, :]
    if b_vec:
        d, d_size = d[..., 0], d_size[..., 0]
    if not np.isscalar(bias_rounding):  # through the activation: GELU's slope is at most ~1.13
        bias_rounding = 1.2 * bias_rounding
        if a_vec:
            bias_rounding = bias_rounding[..., 0, :]
        if b_vec:
            bias_rounding = bias_rounding[..., 0]
    out["d"] = ("d", d, bound(d_size, d, d_dtype) + bias_rounding)
    return out


def _compute_name(step_inputs: dict, a_dtype: str) -> str:
    options = step_inputs.get("options") or {}
    name = options.get("compute_type")
    if name:
        return name
    if options.get("scale_type") == "CUDA_R_16F":  # a half-precision scale implies half-precision compute
        return "COMPUTE_16F"
    return "COMPUTE_64F" if a_dtype in ("float64", "complex128") else "COMPUTE_32F"


def check_values(step: Step, case: Case) -> list[str]:
    """Where this library's outputs disagree with float64 (empty: all within tolerance)."""
    inputs = dict(step.inputs)
    if "aux" in inputs and case.epilog and case.epilog.startswith("DRELU"):
        inputs["aux_bits"] = host_bits(inputs["aux"])
    if "aux" in inputs:
        inputs["aux"] = host_exact(inputs["aux"])
    if step.label == "forward":
        inputs = dict(inputs, alpha=OMIT, beta=OMIT, qualifiers=(False, False, False), scales={}, options={})
    problems = []
    d_dtype = dtype_name(step.d)
    aux_dtypes = {k: dtype_name(v) for k, v in step.aux.items()}
    inputs["a_dtype"] = case.a.dtype
    try:
        expected = reference(inputs, d_dtype, _compute_name(inputs, case.a.dtype), aux_dtypes)
    except Exception as exc:  # noqa: BLE001 — shapes the reference cannot combine: the harness's problem
        raise HarnessError(f"no reference for {step.label}: {type(exc).__name__}: {exc}") from exc
    for name, (kind, value, bound) in expected.items():
        candidates = value if isinstance(value, list) else [value]
        value = candidates[0]
        got_obj = step.d if name == "d" else step.aux.get(name)
        if got_obj is None:
            continue  # a missing key is a metadata mismatch, judged elsewhere
        if kind == "mask":
            bits = host_bits(got_obj)
            m = value.shape[-2]
            got = unpack_relu_bits(bits, m) if bits.shape[-2] * 8 >= m else None
            if got is None or got.shape != value.shape:
                problems.append(f"{name}: shape {bits.shape} cannot hold the (…, {m}, N) mask")
                continue
            decided = np.abs(value) > bound
            wrong = decided & (got != (value > 0))
            if wrong.any():
                problems.append(f"{name}: {int(wrong.sum())} of {int(decided.sum())} decided mask bits wrong")
            continue
        got = step.snap[name] if name in step.snap else host_exact(got_obj)
        if kind == "pre":
            got = got[..., : value.shape[-2], :]
        if kind == "amax":  # ``bound`` holds the scale the amax may have been read after (D's, the aux's)
            alt = abs(float(bound)) if bound is not None else 1.0
            ok = np.isfinite(got).all() and got.size == 1 and any(
                abs(float(got.reshape(-1)[0].real) - t) <= 1e-2 * max(t, 1e-30) for t in
                (float(value), float(value) * alt))
            if not ok:
                what = "max|D|" if name == "result_amax" else "max|aux|"
                problems.append(f"{name}: {got.reshape(-1)[:1]} vs {what} {float(value):.6g}")
            continue
        if kind == "vec" and got.shape != value.shape and got.size == value.size:
            got = got.reshape(value.shape)  # (…, M, 1) against (…, M): the shape is compared between libraries
        if got.shape != value.shape:
            try:
                got = np.broadcast_to(got, value.shape)
            except ValueError:
                problems.append(f"{name}: shape {got.shape}, expected {value.shape}")
                continue
        finite = np.isfinite(value)
        bad_nan = finite & ~np.isfinite(got)
        err = np.abs(got - value)
        for other in candidates[1:]:  # an accepted alternative definition (e.g. scaled by alpha)
            other_err = np.abs(got - other)
            if (other_err <= bound).sum() > (err <= bound).sum():
                err = other_err
        over = finite & np.isfinite(got) & (err > bound)
        if bad_nan.any() or over.any():
            ratio = float(np.max(np.where(over, err / np.maximum(bound, 1e-300), 0))) if over.any() else 0
            problems.append(f"{name}: {int(bad_nan.sum())} NaN/Inf, {int(over.sum())} of {value.size} beyond tolerance"
                            + (f" (worst {ratio:.1f}× the bound)" if over.any() else ""))
    return problems


def metadata(x) -> tuple:
    shape = tuple(getattr(x, "shape", ()))
    try:
        strides = element_strides(x)
    except Exception:  # noqa: BLE001
        strides = ()
    normalized = tuple(s if n > 1 else None for n, s in zip(shape, strides))
    return package_of(x), dtype_name(x), shape, normalized


def compare_steps(ours: Step, theirs: Step) -> list[str]:
    """Metadata differences between nvblaslt's step and nvmath-python's."""
    problems = []
    mine, other = metadata(ours.d), metadata(theirs.d)
    for what, x, y in zip(("package", "dtype", "shape", "order"), mine, other):
        if x != y:
            problems.append(f"D {what}: nvblaslt {x}, nvmath {y}")
    if ours.returned_c != theirs.returned_c:
        problems.append(f"D is c (in place): nvblaslt {ours.returned_c}, nvmath {theirs.returned_c}")
    if set(ours.aux) != set(theirs.aux):
        problems.append(f"aux keys: nvblaslt {sorted(ours.aux)}, nvmath {sorted(theirs.aux)}")
    for key in sorted(set(ours.aux) & set(theirs.aux)):
        for what, x, y in zip(("package", "dtype", "shape", "order"), metadata(ours.aux[key]), metadata(theirs.aux[key])):
            if x != y:
                problems.append(f"aux[{key!r}] {what}: nvblaslt {x}, nvmath {y}")
    return problems


# ---- judging a case ------------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    category: str  # both-ok both-refused gap nvblaslt-only mismatch wrong-nvblaslt wrong-nvmath skipped
    detail: str = ""
    signature: str = ""


def _short_error(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:220]}"


def _signature(exc: BaseException | None) -> str:
    text = _short_error(exc)
    text = re.sub(r"0x[0-9a-f]+", "0x…", text)
    text = re.sub(r"\d+", "N", text)
    return text[:120]


def judge(case: Case, mine: Run, theirs: Run) -> Verdict:
    try:
        return _judge(case, mine, theirs)
    except HarnessError as exc:
        return Verdict("harness", str(exc), "harness")


def _judge(case: Case, mine: Run, theirs: Run) -> Verdict:
    my_values = [p for s in mine.steps for p in (f"{s.label}: {x}" for x in check_values(s, case))]
    their_values = [p for s in theirs.steps for p in (f"{s.label}: {x}" for x in check_values(s, case))]
    if mine.modified_inputs:
        my_values.append(f"modified its inputs {mine.modified_inputs}")
    my_values += mine.problems
    their_values += theirs.problems
    # reference counts: a count nvmath-python does not restore either is not held against nvblaslt
    own, shared_leaks = sorted(set(mine.leaks) - set(theirs.leaks)), sorted(set(mine.leaks) & set(theirs.leaks))
    their_own = sorted(set(theirs.leaks) - set(mine.leaks))
    if own:
        my_values.append(f"{mine.leak_end}: references not released: "
                         + ", ".join(f"{name} {mine.leaks[name]:+d}" for name in own))
    if shared_leaks:
        their_values.append(f"{theirs.leak_end}: references not released by either library: "
                            + ", ".join(f"{name} {theirs.leaks[name]:+d}" for name in shared_leaks))
    if their_own:
        their_values.append(f"{theirs.leak_end}: references not released: "
                            + ", ".join(f"{name} {theirs.leaks[name]:+d}" for name in their_own))
    mine_ok, theirs_ok = mine.error is None, theirs.error is None
    if my_values:
        return Verdict("wrong-nvblaslt", "; ".join(my_values[:4]), my_values[0].split(":")[0])
    if mine_ok and theirs_ok:
        diffs = [p for x, y in zip(mine.steps, theirs.steps) for p in compare_steps(x, y)]
        if len(mine.steps) != len(theirs.steps):
            diffs.append(f"steps: nvblaslt {len(mine.steps)}, nvmath {len(theirs.steps)}")
        if diffs:
            return Verdict("mismatch", "; ".join(diffs[:4]), re.sub(r"\d+", "N", diffs[0].split(":")[0]))
        if their_values:
            return Verdict("wrong-nvmath", "; ".join(their_values[:3]), their_values[0].split(":")[0])
        return Verdict("both-ok")
    if not mine_ok and not theirs_ok:
        return Verdict("both-refused", f"nvblaslt {_short_error(mine.error)} | nvmath {_short_error(theirs.error)}",
                       _signature(mine.error))
    if mine_ok:
        return Verdict("nvblaslt-only", f"nvmath {_short_error(theirs.error)}", _signature(theirs.error))
    if their_values:  # nvmath ran, but wrongly: not a gap worth closing as is
        return Verdict("wrong-nvmath", f"nvblaslt refused ({_short_error(mine.error)}); nvmath: "
                       + "; ".join(their_values[:2]), their_values[0].split(":")[0])
    return Verdict("gap", f"at {mine.error_step}: {_short_error(mine.error)}", _signature(mine.error))


# ---- self-test: the harness against a NumPy stand-in for both libraries (no GPU needed) -------------------------------
SELF_TEST = {"on": False}


def _dtype_of_type(value) -> str:
    name = getattr(value, "name", value)
    inverse = {v: k for k, v in CUDA_NAME.items()}
    return inverse.get(name, name)


def _order_like(x: np.ndarray, column_major: bool) -> np.ndarray:
    if x.ndim < 2:
        return np.array(x)
    if not column_major:
        return np.ascontiguousarray(x)
    return np.swapaxes(np.ascontiguousarray(np.swapaxes(x, -1, -2)), -1, -2)


def _is_column_major(x) -> bool:
    strides = element_strides(x)
    return len(strides) >= 2 and (strides[-2] == 1 or x.shape[-2] == 1) and not (x.shape[-2] > 1 and strides[-1] == 1
                                                                                 and strides[-2] != 1)


_FAKE_KEPT: list = []  # the planted refcount defect keeps its operands here
_FAKE_CONJ_CACHE: dict = {}  # the planted conj-cache defect: conjugate flags cached by shape


class _FakeMatmul:
    """nvmath-python's matmul semantics as this harness understands them, computed with NumPy."""

    def __init__(self, lib, a, b, c=None, *, alpha=None, beta=None, qualifiers=None, options=None,
                 quantization_scales=None, stream=None):
        if c is not None and beta is None:
            raise ValueError("beta is required with c")
        if host_exact(a).shape[-1] != host_exact(b).shape[-2 if np.ndim(b) > 1 else 0]:
            raise ValueError("K mismatch")
        self.lib, self.ops = lib, {"a": a, "b": b, "c": c}
        self.alpha, self.beta = alpha, beta
        self.conj = tuple(bool(q["is_conjugate"]) for q in qualifiers) if qualifiers is not None else (False,) * 3
        if lib.bug == "conj-ignored":
            self.conj = (False, False, False)
        self.options = dict(options or {})
        if self.options.get("inplace") and (c is None or np.shape(c) != np.broadcast_shapes(
                np.shape(a)[:-2], np.shape(b)[:-2]) + (np.shape(a)[-2], np.shape(b)[-1])):
            raise ValueError("in place: c must be the full result")
        self.scales = dict(quantization_scales or {})
        self.epilog, self.inputs = None, {}
        if lib.bug == "refcount":
            _FAKE_KEPT.extend(x for x in (a, b, c) if x is not None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def plan(self, *, epilog=None, epilog_inputs=None, preferences=None, algorithms=None, stream=None):
        self.epilog = epilog.name if epilog is not None else None
        self.inputs = {k: v for k, v in (epilog_inputs or {}).items() if k != "aux_quantization_scale"}
        name = self.epilog or ""
        required = ({"bias"} if "BIAS" in name and "BGRAD" not in name else set()) | (
            {"relu_aux"} if name.startswith("DRELU") else set()) | ({"gelu_aux"} if name.startswith("DGELU") else set())
        if set(self.inputs) != required:
            raise ValueError(f"{name} needs {required}")
        if self.lib.bug == "refuse-bias" and "bias" in required:
            raise ValueError("bias refused (injected)")
        return ["algorithm-0", "algorithm-1"]

    def autotune(self, iterations=10, **kwargs):
        c = self.ops["c"]
        if self.lib.bug == "inplace-autotune" and self.options.get("inplace") and c is not None:
            c[...] = 2 * c + 1  # a timing launch written to the caller's c

    def release_operands(self):
        self.ops = {k: None for k in self.ops}
        self.inputs = {k: None for k in self.inputs}

    def reset_operands(self, *, a=None, b=None, c=None, alpha=None, beta=None, epilog_inputs=None,
                       quantization_scales=None, stream=None):
        for key, value in (("a", a), ("b", b), ("c", c)):
            if value is not None:
                self.ops[key] = value
        self.alpha = alpha if alpha is not None else self.alpha
        self.beta = beta if beta is not None else self.beta
        self.inputs.update(epilog_inputs or {})
        self.scales.update(quantization_scales or {})

    def free(self):
        self.ops, self.inputs = {}, {}

    def execute(self, *, algorithm=None, stream=None, release_workspace=False):
        if not self.ops or self.ops["a"] is None:
            raise RuntimeError("execute() after free() or release_operands()")
        a, b, c = self.ops["a"], self.ops["b"], self.ops["c"]
        options = self.options
        inputs = {"a": host_exact(a), "b": host_exact(b), "alpha": self.alpha, "beta": self.beta, "epilog": self.epilog,
                  "qualifiers": self.conj, "options": {"result_amax": options.get("result_amax")},
                  "scales": {k: float(np.asarray(host_exact(v) if not isinstance(v, (int, float)) else v).reshape(-1)[0])
                             for k, v in self.scales.items()}}
        if c is not None:
            inputs["c"] = host_exact(c)
        if "bias" in self.inputs:
            inputs["bias"] = host_exact(self.inputs["bias"])
        if "relu_aux" in self.inputs:
            inputs["aux_bits"] = host_bits(self.inputs["relu_aux"])
        if "gelu_aux" in self.inputs:
            inputs["aux"] = host_exact(self.inputs["gelu_aux"])
        d_dtype = dtype_name(c) if c is not None else str(a.dtype)
        result_type = options.get("result_type")
        if result_type is not None:
            if isinstance(result_type, int) and not hasattr(result_type, "name"):
                result_type = self.lib.CudaDataType(result_type)
            d_dtype = _dtype_of_type(result_type)
            d_dtype = str(np.dtype(d_dtype)) if not isinstance(d_dtype, str) else d_dtype
        ref = reference(inputs, d_dtype, "COMPUTE_32F", {})
        d = ref["d"][1]
        name = self.epilog or ""
        if c is not None:
            column = _is_column_major(c)
        elif name and name not in ("RELU", "GELU", "BGRADA"):
            column = True
        else:
            column = _is_column_major(a) if np.ndim(a) >= 2 else True
        if self.lib.bug == "order":
            column = not column
        if self.lib.bug == "value" and d.size:
            d = d + 0.1 * np.abs(d).max() + 0.1
        out = _order_like(np.asarray(d).astype(d_dtype), column)
        aux = {}
        z = ref.get("relu_aux", ref.get("gelu_aux", (None, None)))[1]
        if "RELU_AUX" in name:
            m, n = z.shape[-2:]
            ld = (-(-m // 8) + 15) // 16 * 16  # ceil(M / 8) bytes, rounded up to 16
            bits = np.zeros((*z.shape[:-2], ld * 8, n), dtype=np.uint8)
            bits[..., :m, :] = z > 0
            packed = np.packbits(bits, axis=-2, bitorder="little")
            aux["relu_aux"] = _order_like(packed.astype(np.int8 if self.lib.bug == "aux-dtype" else np.uint8), True)
        if "GELU_AUX" in name:
            m, n = z.shape[-2:]
            pre = np.zeros((*z.shape[:-2], -(-m // 8) * 8, n))
            pre[..., :m, :] = z
            aux["gelu_aux"] = _order_like(pre.astype(d_dtype), True)
        for key in ("drelu_bgrad", "dgelu_bgrad", "bgrada", "bgradb"):
            if key in ref:
                value = ref[key][1]
                vec = value[0] if isinstance(value, list) else value
                vec = vec[..., None] if vec.ndim > 1 else vec
                aux[key] = np.ascontiguousarray(vec.astype(d_dtype))
        if "result_amax" in ref:
            aux["result_amax"] = np.array([ref["result_amax"][1]], dtype=np.float32)
        if options.get("inplace") and c is not None:
            c[...] = out
            out = c
        return (out, aux) if aux else out


class FakeLibrary(Library):
    def __init__(self, name: str, bug: str = ""):
        import enum

        self.name, self.bug = name, bug
        self.mod = self
        self.Epilog = enum.IntEnum("MatmulEpilog", ["DEFAULT", *EPILOGS])
        self.ComputeType = enum.IntEnum("ComputeType", list(U_COMPUTE))
        self.CudaDataType = enum.IntEnum("CudaDataType", sorted(set(CUDA_NAME.values())))
        self.Options = None

    def Matmul(self, a, b, c=None, **kwargs):  # noqa: N802 — stands in for the class
        return _FakeMatmul(self, a, b, c, **kwargs)

    def matmul(self, a, b, c=None, *, epilog=None, epilog_inputs=None, preferences=None, algorithm=None, **kwargs):
        mm = _FakeMatmul(self, a, b, c, **kwargs)
        if self.bug == "conj-cache":  # a plan cache whose key leaves the conjugate flags out
            key = (np.shape(a), np.shape(b), np.shape(c), str(a.dtype))
            mm.conj = _FAKE_CONJ_CACHE.setdefault(key, mm.conj)
        mm.plan(epilog=epilog, epilog_inputs=epilog_inputs, preferences=preferences)
        return mm.execute()


# ---- the run ----------------------------------------------------------------------------------------------------
CATEGORIES = ["both-ok", "both-refused", "gap", "mismatch", "wrong-nvblaslt", "wrong-nvmath", "nvblaslt-only",
              "harness", "skipped"]


def _quiet() -> None:
    logging.getLogger().setLevel(logging.ERROR)  # nvmath-python logs its warnings on the root logger
    logging.getLogger("nvblaslt").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


def _import_nvmath():
    try:
        import nvmath.linalg.advanced  # noqa: F401
        return
    except ImportError:
        pass
    site = os.environ.get("NVMATH_SITE", "/tmp/site")
    if os.path.isdir(site) and site not in sys.path:
        sys.path.append(site)  # after the installed packages: /tmp/site only adds what is missing
    import nvmath.linalg.advanced  # noqa: F401


def _health(frameworks) -> None:
    try:
        if "torch" in sys.modules and sys.modules["torch"].cuda.is_available():
            torch = sys.modules["torch"]
            assert float(torch.ones(4, device="cuda").sum().item()) == 4.0
        if "cupy" in sys.modules:
            cupy = sys.modules["cupy"]
            assert float(cupy.ones(4).sum().get()) == 4.0
    except Exception as exc:  # noqa: BLE001
        raise ContextLost(f"{type(exc).__name__}: {exc}") from exc


def run_case(case: Case, libs: dict) -> tuple[Verdict, Run | None, Run | None]:
    shared: dict = {}
    theirs = run_library(libs["nvmath"], case, libs["nvmath"], shared)
    mine = run_library(libs["nvblaslt"], case, libs["nvmath"], shared)
    verdict = judge(case, mine, theirs)
    return verdict, mine, theirs


def _summary(label: str, counts, skipped: bool = True) -> str:
    """``label: N cases: …`` with every verdict's count (the overall line and each group's)."""
    total = sum(counts[c] for c in CATEGORIES if c != "skipped")
    line = (f"{label}: {total} cases: {counts['both-ok']} both ok, {counts['both-refused']} both refused, "
            f"{counts['gap']} gaps, {counts['mismatch']} mismatches, {counts['wrong-nvblaslt']} wrong (nvblaslt), "
            f"{counts['wrong-nvmath']} wrong (nvmath), {counts['nvblaslt-only']} nvblaslt-only")
    if counts["harness"]:
        line += f", {counts['harness']} harness"
    if skipped and counts["skipped"]:
        line += f" ({counts['skipped']} skipped)"
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="nvmath-python 1.0 vs nvblaslt, both against float64")
    parser.add_argument("--cases", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help=f"comma-separated groups: {', '.join(GROUPS)}")
    parser.add_argument("--frameworks", default="cupy,torch,numpy",
                        help="cupy, torch (its CPU tensors join the host group) and numpy (host)")
    parser.add_argument("--log", help="write one JSON line per case here")
    parser.add_argument("--case", type=int, action="append", help="run only this case index (repeatable)")
    parser.add_argument("--verbose", action="store_true", help="print every case and each failure's traceback")
    parser.add_argument("--list", action="store_true", help="print the cases, run nothing")
    parser.add_argument("--self-test", nargs="?", const="none", metavar="BUG",
                        help="no GPU: both libraries replaced by a NumPy stand-in; BUG (value, order, aux-dtype, "
                             "refuse-bias) plants a defect in the nvblaslt stand-in, which the run must catch")
    args = parser.parse_args(argv)
    if args.self_test:
        SELF_TEST["on"] = True
        args.frameworks = "numpy"

    groups = list(GROUPS) if not args.only else [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown groups {unknown}; known: {', '.join(GROUPS)}")
    requested = tuple(f.strip() for f in args.frameworks.split(",") if f.strip())
    frameworks = list(requested)
    if "torch" in frameworks:
        frameworks.append("torch_cpu")
    if args.case:
        indices = args.case
    else:  # the first --cases indices whose group was asked for (a case's group depends on the seed only)
        indices = [i for i in range(args.cases * 200) if group_of(args.seed, i) in groups][: args.cases]
    repro_options = f"--seed {args.seed}" + (f" --frameworks {args.frameworks}" if args.frameworks !=
                                             parser.get_default("frameworks") else "")

    if args.list:
        for i in indices:
            try:
                print(make_case(args.seed, i, tuple(frameworks)).describe())
            except CaseSkipped as exc:
                print(f"#{i} skipped: {exc}")
        return 0

    _quiet()
    available = []
    for name in frameworks:
        module = {"torch_cpu": "torch"}.get(name, name)
        try:
            __import__(module)
            available.append(name)
        except ImportError:
            print(f"nvmath_diff: {module} is not installed; its cases are skipped", file=sys.stderr)
    frameworks = tuple(available)
    if args.self_test:
        libs = {"nvmath": FakeLibrary("nvmath"),
                "nvblaslt": FakeLibrary("nvblaslt", "" if args.self_test == "none" else args.self_test)}
        versions = f"self-test (planted defect: {args.self_test})"
    else:
        _import_nvmath()
        libs = {"nvmath": Library("nvmath"), "nvblaslt": Library("nvblaslt")}
        import nvmath as _nvmath

        import nvblaslt as _nvblaslt

        versions = (f"nvmath-python {getattr(_nvmath, '__version__', '?')}, nvblaslt "
                    f"{getattr(_nvblaslt, '__version__', '?')}")
    # the refcount bucket collects garbage before each count: with torch, CuPy and nvmath-python loaded a full
    # collection takes ~0.1 s; what exists now (modules, their tables) is moved out of the collector's sight
    gc.collect()
    gc.freeze()
    print(f"nvmath_diff: {versions}, seed {args.seed}, groups {','.join(groups)}, "
          f"frameworks {','.join(frameworks)}", flush=True)
    log = open(args.log, "w") if args.log else None
    counts = collections.Counter()
    by_group = collections.defaultdict(collections.Counter)
    listing = collections.defaultdict(list)  # (category, group, signature) -> [(desc, detail)]
    start = time.perf_counter()
    lost = None
    for n, index in enumerate(indices):
        try:
            case = make_case(args.seed, index, frameworks)
        except CaseSkipped:
            counts["skipped"] += 1
            by_group[group_of(args.seed, index)]["skipped"] += 1
            continue
        try:
            verdict, mine, theirs = run_case(case, libs)
        except CaseSkipped as exc:
            counts["skipped"] += 1
            by_group[case.group]["skipped"] += 1
            if args.verbose:
                print(f"  skipped {case.describe()}: {exc}")
            continue
        except ContextLost as exc:
            lost = f"{case.describe()}: {exc}"
            verdict, mine, theirs = Verdict("wrong-nvblaslt", f"CUDA context lost: {exc}", "context lost"), None, None
        counts[verdict.category] += 1
        by_group[case.group][verdict.category] += 1
        if verdict.category not in ("both-ok",):
            listing[(verdict.category, case.group, verdict.signature)].append((case.describe(), verdict.detail))
        if args.verbose or (args.case and verdict.category != "both-ok"):
            print(f"[{verdict.category}] {case.describe()}\n    {verdict.detail}")
            for run in (mine, theirs):
                if run is not None and run.error is not None and (args.case or args.verbose):
                    print(f"    --- {run.library} at {run.error_step} ---\n" + "\n".join(
                        "    " + line for line in run.traceback.rstrip().splitlines()[-8:]))
        if log:
            log.write(json.dumps({"index": index, "group": case.group, "case": case.describe(),
                                  "verdict": verdict.category, "detail": verdict.detail,
                                  "nvblaslt_error": _short_error(mine.error) if mine else "",
                                  "nvmath_error": _short_error(theirs.error) if theirs else ""}) + "\n")
        del mine, theirs
        if lost:
            break
        if (n + 1) % 100 == 0:
            gc.collect()
            _health(frameworks)
            print(f"  {n + 1} cases, {time.perf_counter() - start:.0f} s: " + ", ".join(
                f"{counts[c]} {c}" for c in CATEGORIES if counts[c]), flush=True)
    if log:
        log.close()
    print()
    order = {"wrong-nvblaslt": 0, "mismatch": 1, "gap": 2, "harness": 3, "wrong-nvmath": 4, "nvblaslt-only": 5,
             "both-refused": 6}
    for (category, group, _signature), items in sorted(listing.items(), key=lambda kv: (order.get(kv[0][0], 9),
                                                                                       kv[0][1], -len(kv[1]))):
        if category == "both-refused" and not args.verbose:
            continue
        desc, detail = items[0]
        index = re.search(r"#(\d+)", desc).group(1)
        print(f"[{category}] {group} ×{len(items)}: {detail[:300]}\n    e.g. {desc}\n"
              f"    repro: python -m tests.differential.nvmath_diff {repro_options} --case {index}")
    print("\nper group (bucket):")
    for group in [g for g in GROUPS if g in by_group]:
        print("  " + _summary(f"group {group}", by_group[group]))
    if counts["skipped"]:
        print(f"({counts['skipped']} cases skipped: a framework or dtype is missing here)")
    if counts["harness"]:
        print(f"({counts['harness']} cases the harness could not judge: see [harness] above)")
    print(f"{_summary('nvmath_diff', counts, skipped=False)} [{time.perf_counter() - start:.0f} s]")
    if lost:
        print(f"nvmath_diff: stopped early, the CUDA context was lost at {lost}")
        return 2
    return 1 if counts["wrong-nvblaslt"] or counts["mismatch"] else 0


if __name__ == "__main__":
    sys.exit(main())
