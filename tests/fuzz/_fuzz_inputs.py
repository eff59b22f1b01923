"""Inputs for the CPU fuzz of the public API (``test_cpu_fuzz.py``): stand-in arrays, malformed
DLPack capsules and CAI dicts, bad scalars, options, preferences, qualifiers, scales, streams,
epilogs and low-level descriptor arguments — and a set of valid calls beside them.

Every case is a zero-argument callable plus what is expected of it (``Case.kind``):

    invalid  refused by nvblaslt's own checks, with an NvblasltError naming the argument
    valid    gets past every check to the first step that needs a GPU (here: a clear no-GPU error)
    either   one of the two above (nvmath-python's rule is loose, or checking needs a GPU)
    ok       returns (descriptor-level calls need no GPU)
    optional returns, or is refused naming the argument
    any      returns, or raises any NvblasltError (a value only the C library can judge)

A refusal (other than for the missing GPU) must be an NvblasltError that is also ValueError or
TypeError; a case with ``warns`` must also give a warning matching one of them.

An exception a stand-in raises itself (from ``__dlpack__``, ``__float__``, …) carries the
attribute ``from_stand_in``; nvblaslt should wrap it in an NvblasltError naming the argument.

Stand-ins point at fake device addresses (never dereferenced on a machine without a GPU) or,
for host (kDLCPU) arrays, at real NumPy memory. Cases are built lazily and deterministically,
so the parent process and each worker process agree on them by id.

    python -m tests.fuzz._fuzz_inputs --list            # the case ids (from the repository root)
    python -m tests.fuzz._fuzz_inputs ID [ID ...]       # run cases, one JSON line per event
"""

from __future__ import annotations

import ctypes
import enum
import fractions
import json
import decimal
import re
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tests.fakes import FakeGpuScalar

BASE = 0x7F0000000000  # a fake, 256-byte aligned device address; never dereferenced here
M, K, N, BATCH = 8, 4, 6, 3
RELU_LD = 16  # bytes: ceil(M / 8) rounded up to 16 (128 bits)
GELU_LD = 8  # elements: M rounded up to 8
QUALIFIERS_DTYPE = np.dtype([("structure", object), ("is_conjugate", "<i4")])  # nvmath's matrix_qualifiers_dtype


# ---- DLPack in ctypes: our own structs, so a malformed capsule can say anything ----------------
class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


# A private prototype: argtypes set on the shared ctypes.pythonapi.PyCapsule_New would be changed
# under us by whoever sets them next (nvblaslt._dlpack does).
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))

# DLPack dtype codes and bits by name
DL = {"float32": (2, 32), "float16": (2, 16), "float64": (2, 64), "bfloat16": (4, 16), "complex64": (5, 64),
      "complex128": (5, 128), "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8), "int8": (0, 8), "uint8": (1, 8),
      "int32": (0, 32), "bool": (6, 8)}
ITEMSIZE = {"float32": 4, "float16": 2, "float64": 8, "bfloat16": 2, "complex64": 8, "complex128": 16,
            "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1, "int32": 4, "bool": 1}


def _compact(shape, order="C"):
    strides, step = [0] * len(shape), 1
    axes = range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))
    if order == "F" and len(shape) > 2:  # batch of column-major matrices: batch axes outermost
        axes = [len(shape) - 2, len(shape) - 1, *range(len(shape) - 3, -1, -1)]
    for axis in axes:
        strides[axis] = step
        step *= max(shape[axis], 1)
    return tuple(strides)


class Capsule:
    """A DLPack producer whose capsule fields are all set by hand (the malformed ones too).

    ``shape=None``/``strides=None`` give NULL pointers; ``ndim`` may disagree with ``len(shape)``
    (the shape array then has only ``len(shape)`` entries)."""

    def __init__(self, shape=(M, K), dtype="float32", *, strides="C", data=BASE, device=(2, 0), ndim=None,
                 code_bits=None, lanes=1, byte_offset=0, versioned=True, version=(1, 0), flags=0, name=None,
                 dlpack_device=None, keep=None):
        self.shape, self.dtype = shape, dtype
        self.strides = _compact(shape, strides) if isinstance(strides, str) and shape is not None else strides
        self.data, self.device, self.ndim = data, device, ndim
        self.code_bits = code_bits or DL[dtype]
        self.lanes, self.byte_offset = lanes, byte_offset
        self.versioned, self.version, self.flags, self.name = versioned, version, flags, name
        self._dlpack_device = device if dlpack_device is None else dlpack_device
        self._alive = [keep]  # everything a capsule points at stays alive with the producer

    def __dlpack_device__(self):
        return self._dlpack_device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        versioned = self.versioned and max_version is not None
        managed = _ManagedVersioned() if versioned else _Managed()
        tensor = managed.dl_tensor
        tensor.data = self.data
        tensor.device = _Device(*self.device)
        shape = None if self.shape is None else (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
        strides = None if self.strides is None else (ctypes.c_int64 * max(len(self.strides), 1))(*self.strides)
        tensor.ndim = len(self.shape or ()) if self.ndim is None else self.ndim
        tensor.dtype = _DType(self.code_bits[0], self.code_bits[1], self.lanes)
        tensor.shape = ctypes.addressof(shape) if shape is not None else None
        tensor.strides = ctypes.addressof(strides) if strides is not None else None
        tensor.byte_offset = self.byte_offset
        if versioned:
            managed.version = _Version(*self.version)
            managed.flags = self.flags
        name = ctypes.create_string_buffer(self.name or (b"dltensor_versioned" if versioned else b"dltensor"))
        self._alive += [managed, shape, strides, name]
        return _capsule_new(ctypes.addressof(managed), ctypes.addressof(name), None)

    def __repr__(self):
        return f"Capsule({self.shape}, {self.dtype}, strides={self.strides}, device={self.device})"


class OldProducer(Capsule):
    """A DLPack producer from before DLPack 1.0: ``__dlpack__`` takes no ``max_version``."""

    def __dlpack__(self, stream=None):
        return Capsule.__dlpack__(self, stream=stream)


class Weird(Capsule):
    """A producer whose ``__dlpack__`` or ``__dlpack_device__`` misbehaves."""

    def __init__(self, *args, dlpack=None, device_method=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._dlpack, self._device_method = dlpack, device_method

    def __dlpack_device__(self):
        return self._device_method() if self._device_method else Capsule.__dlpack_device__(self)

    def __dlpack__(self, **kwargs):
        return self._dlpack() if self._dlpack else Capsule.__dlpack__(self, **kwargs)


class CAI:
    """A ``__cuda_array_interface__`` producer with a hand-made dict (or one that raises)."""

    def __init__(self, interface):
        self._interface = interface

    @property
    def __cuda_array_interface__(self):
        if isinstance(self._interface, BaseException):
            _raises(self._interface)()
        return self._interface

    def __repr__(self):
        return f"CAI({self._interface!r})"


def cai(shape=(M, K), typestr="<f4", **changes):
    interface = {"shape": shape, "typestr": typestr, "data": (BASE, False), "strides": None, "version": 3}
    interface.update(changes)
    return CAI({k: v for k, v in interface.items() if v is not _DROP})


_DROP = object()


class Stream:
    """A stream stand-in exposing whichever protocol attribute it is given."""

    def __init__(self, **attributes):
        for key, value in attributes.items():
            setattr(self, key, value)


def _raises(exc):
    def f(*args, **kwargs):
        exc.from_stand_in = True
        raise exc
    return f


class _Boom(Exception):
    pass


# ---- the problem every operand case starts from ----------------------------------------------------
def templates():
    """Valid operands of the base problem (M=8, K=4, N=6), each at its own fake address."""
    return {
        "a": dict(shape=(M, K), dtype="float32", strides="C", data=BASE),
        "b": dict(shape=(K, N), dtype="float32", strides="C", data=BASE + 0x10000),
        "c": dict(shape=(M, N), dtype="float32", strides="F", data=BASE + 0x20000),
        "bias": dict(shape=(M,), dtype="float32", strides="C", data=BASE + 0x30000),
        "relu_aux": dict(shape=(RELU_LD, N), dtype="uint8", strides="F", data=BASE + 0x40000),
        "gelu_aux": dict(shape=(GELU_LD, N), dtype="float32", strides="F", data=BASE + 0x50000),
        "out": dict(shape=(M, N), dtype="float32", strides="F", data=BASE + 0x60000),
    }


def operand(position, /, **changes):
    spec = dict(templates()[position])
    spec.update(changes)
    return Capsule(**spec)


EPILOG_OF = {"bias": "BIAS", "relu_aux": "DRELU", "gelu_aux": "DGELU"}


def problem_call(entry: str, ops: dict, **kwargs):
    """One call of the public API on ``ops`` (keys a, b, c, bias, relu_aux, gelu_aux, out)."""
    import nvblaslt

    epilog = kwargs.pop("epilog", None)
    inputs = kwargs.pop("epilog_inputs", None)
    for key, epi in EPILOG_OF.items():
        if key in ops:
            epilog = epilog or epi
            inputs = {key: ops[key]} if inputs is None else inputs
    c = ops.get("c")
    if c is not None and "beta" not in kwargs:
        kwargs["beta"] = 1.0
    if entry == "fn":
        if "out" in ops:
            kwargs["out"] = ops["out"]
        if epilog is not None:
            kwargs["epilog"] = epilog
        if inputs is not None:
            kwargs["epilog_inputs"] = inputs
        return nvblaslt.matmul(ops["a"], ops["b"], c, **kwargs)
    plan_kwargs = {k: kwargs.pop(k) for k in ("preferences", "algorithms") if k in kwargs}
    mm = nvblaslt.Matmul(ops["a"], ops["b"], c, **kwargs)
    mm.plan(epilog=epilog, epilog_inputs=inputs, **plan_kwargs)
    return mm


def base_ops(position: str | None = None) -> dict:
    ops = {"a": operand("a"), "b": operand("b")}
    if position in ("c", "bias", "relu_aux", "gelu_aux", "out"):
        ops[position] = operand(position)
    return ops


# ---- cases ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    id: str
    kind: str  # invalid / valid / either / ok / optional / any
    call: Callable[[], object] = field(repr=False)
    tokens: tuple[str, ...] = ()  # regexes: the refusal must match one (it names the argument)
    note: str = ""
    warns: tuple[str, ...] = ()  # regexes: a warning the call gives must match one (accepted, but said)


def arg(name: str) -> tuple[str, ...]:
    """Regexes that find ``name`` named as an argument in an error message."""
    n = re.escape(name)
    found = [rf"(?<![\w.\[])'?{n}'?\s*[:=]", rf"['\"`]{n}['\"`]", rf"(?<![\w.\[]){n},\s", rf",\s*{n}\b:",
             rf"\b{n}\s*\(", rf"\b(argument|operand|parameter|option|preference)s?\s+['\"`]?{n}\b",
             rf"(?<![\w.\[]){n} (is|has)\b", rf"(?<![\w.\[]){n}'s\b", rf"(?<![\w.\[]){n}(\[|\.\w)"]
    if len(name) == 1:  # operands a, b, c: nvmath says "operand A"
        upper = re.escape(name.upper())
        found += [rf"\boperands?\s+{upper}\b", rf"(?<![\w.\[]){upper}:"]
    if name in ("bias", "relu_aux", "gelu_aux"):
        found += [rf"epilog_inputs\[['\"]{n}['\"]\]", rf"\b{n}\b"]
    return tuple(found)


POSITIONS = ("a", "b", "c", "bias", "relu_aux", "gelu_aux")


def operand_faults(position: str):
    """(variant, make, kind) for one operand position: everything that can be wrong with an array."""
    t = templates()[position]
    shape, dtype = t["shape"], t["dtype"]
    ndim = len(shape)
    host = np.ones(shape, dtype=np.float32 if dtype not in ("uint8",) else np.uint8)
    other_dtype = "float16" if dtype != "float16" else "float32"
    v = []

    def add(variant, make, kind="invalid"):
        v.append((variant, make, kind))

    # not arrays at all
    if position in ("a", "b"):
        add("None", lambda: None)
    add("list", lambda: [[1.0] * shape[-1]] * shape[0] if ndim == 2 else [1.0] * shape[0])
    add("int", lambda: 3)
    add("str", lambda: "matrix")
    add("dict", lambda: {"shape": shape})
    add("object", lambda: object())
    add("numpy-object-array", lambda: np.array([[object()]], dtype=object))
    add("type-itself", lambda: Capsule)
    # DLPack capsules with impossible headers
    add("ndim=2**30", lambda: operand(position, ndim=2**30))
    add("ndim=2**31-1", lambda: operand(position, ndim=2**31 - 1))
    add("ndim=-1", lambda: operand(position, ndim=-1))
    add("ndim=0", lambda: operand(position, shape=(), strides=()))
    add("ndim=9", lambda: operand(position, shape=(1,) * 7 + shape[-2:] if ndim == 2 else (1,) * 8 + shape), "either")
    add("shape-NULL", lambda: operand(position, shape=None, ndim=ndim, strides=None))
    add("negative-extent", lambda: operand(position, shape=(-shape[0], *shape[1:]), strides=(1,) * ndim))
    add("zero-extent", lambda: operand(position, shape=(0, *shape[1:])))
    add("extent-2**62", lambda: operand(position, shape=(2**62, *shape[1:])))
    add("extents-overflow-int64", lambda: operand(position, shape=(2**62,) * ndim, strides=(1,) * ndim))
    add("extent-int64-max", lambda: operand(position, shape=(2**63 - 1, *shape[1:]), strides=(1,) * ndim))
    add("data-NULL", lambda: operand(position, data=None))
    add("strides-negative", lambda: operand(position, strides=tuple(-s for s in _compact(shape, "C"))))
    add("strides-all-zero", lambda: operand(position, strides=(0,) * ndim))
    add("strides-2**62", lambda: operand(position, strides=(2**62,) * ndim))
    if ndim == 2:
        add("strides-no-unit", lambda: operand(position, strides=(2 * shape[1], 2)))
    add("byte_offset-odd", lambda: operand(position, byte_offset=1), "invalid" if dtype != "uint8" else "either")
    add("byte_offset-2**64-1", lambda: operand(position, byte_offset=2**64 - 1))
    add("address-wraps", lambda: operand(position, data=2**64 - 16))
    add("lanes=2", lambda: operand(position, lanes=2))
    add("lanes=0", lambda: operand(position, lanes=0))
    add("dtype-code-99", lambda: operand(position, code_bits=(99, 32)))
    add("dtype-float-7-bits", lambda: operand(position, code_bits=(2, 7)))
    add("dtype-float-0-bits", lambda: operand(position, code_bits=(2, 0)))
    add("dtype-bool", lambda: operand(position, dtype="bool"))
    add("dtype-int32", lambda: operand(position, dtype="int32"))
    add(f"dtype-{other_dtype}", lambda: operand(position, dtype=other_dtype),
        "either" if position in ("c", "bias") else "invalid")
    if position not in ("relu_aux",):
        add("dtype-complex64-alone", lambda: operand(position, dtype="complex64"))
    add("device-type-OpenCL", lambda: operand(position, device=(4, 0)))
    add("device-type-ROCm", lambda: operand(position, device=(10, 0)))
    add("device-type-99", lambda: operand(position, device=(99, 0)))
    add("device-id--1", lambda: operand(position, device=(2, -1)))
    add("device-id-7", lambda: operand(position, device=(2, 7)), "either")
    add("device-disagrees-with-capsule", lambda: operand(position, dlpack_device=(2, 0), device=(1, 0)))
    # a host array (real memory) among GPU operands: mixing memory spaces
    add("host-among-device", lambda: Capsule(shape, dtype, data=host.ctypes.data, device=(1, 0), keep=host))
    add("pinned-host-among-device", lambda: Capsule(shape, dtype, data=host.ctypes.data, device=(3, 0), keep=host),
        "either")
    add("dlpack-version-99", lambda: operand(position, version=(99, 0)))
    add("capsule-name-wrong", lambda: operand(position, name=b"not_a_tensor"))
    add("capsule-used", lambda: operand(position, name=b"used_dltensor", versioned=False))
    add("capsule-versioned-name-unversioned-struct", lambda: operand(position, name=b"dltensor_versioned",
                                                                      versioned=False))
    add("__dlpack__-returns-None", lambda: Weird(**templates()[position], dlpack=lambda: None))
    add("__dlpack__-returns-int", lambda: Weird(**templates()[position], dlpack=lambda: 12345))
    add("__dlpack__-raises-BufferError", lambda: Weird(**templates()[position], dlpack=_raises(BufferError("no"))))
    add("__dlpack__-raises-custom", lambda: Weird(**templates()[position], dlpack=_raises(_Boom("boom"))))
    add("__dlpack__-raises-ZeroDivision", lambda: Weird(**templates()[position], dlpack=_raises(ZeroDivisionError())))
    add("__dlpack_device__-None", lambda: Weird(**templates()[position], device_method=lambda: None))
    add("__dlpack_device__-strings", lambda: Weird(**templates()[position], device_method=lambda: ("cuda", "0")))
    add("__dlpack_device__-1-tuple", lambda: Weird(**templates()[position], device_method=lambda: (2,)))
    add("__dlpack_device__-raises", lambda: Weird(**templates()[position], device_method=_raises(_Boom("dev"))))
    # CAI
    typestr = {"float32": "<f4", "uint8": "|u1"}[dtype]
    add("cai-typestr-<f3", lambda: cai(shape, "<f3"))
    add("cai-typestr->f4-big-endian", lambda: cai(shape, ">f4"))
    add("cai-typestr-bool", lambda: cai(shape, "|b1"))
    add("cai-typestr-no-endian", lambda: cai(shape, "f4"), "either")
    add("cai-typestr-int", lambda: cai(shape, 123))
    add("cai-typestr-None", lambda: cai(shape, None))
    add("cai-shape-int", lambda: cai(8, typestr))
    add("cai-shape-None", lambda: cai(None, typestr))
    add("cai-shape-strings", lambda: cai(("a",) * ndim, typestr))
    add("cai-shape-floats", lambda: cai(tuple(float(s) for s in shape), typestr))
    add("cai-shape-negative", lambda: cai((-shape[0], *shape[1:]), typestr))
    add("cai-shape-2**63", lambda: cai((2**63, *shape[1:]), typestr))
    add("cai-shape-1000-dims", lambda: cai((1,) * 1000, typestr))
    add("cai-strides-wrong-count", lambda: cai(shape, typestr, strides=(4,) * (ndim + 1)))
    add("cai-strides-not-itemsize-multiple", lambda: cai(shape, typestr, strides=(3,) * ndim),
        "invalid" if dtype != "uint8" else "either")
    add("cai-strides-strings", lambda: cai(shape, typestr, strides=("x",) * ndim))
    add("cai-strides-negative", lambda: cai(shape, typestr, strides=(-4,) * ndim))
    add("cai-data-missing", lambda: cai(shape, typestr, data=_DROP))
    add("cai-data-None", lambda: cai(shape, typestr, data=None))
    add("cai-data-NULL-nonempty", lambda: cai(shape, typestr, data=(0, False)))
    add("cai-data-string-pointer", lambda: cai(shape, typestr, data=("0x10", False)))
    add("cai-data-not-tuple", lambda: cai(shape, typestr, data=5))
    add("cai-data-1-tuple", lambda: cai(shape, typestr, data=(BASE,)))
    add("cai-data-2**70", lambda: cai(shape, typestr, data=(2**70, False)))
    add("cai-data-negative", lambda: cai(shape, typestr, data=(-256, False)))
    add("cai-mask", lambda: cai(shape, typestr, mask=object()))
    add("cai-stream-0", lambda: cai(shape, typestr, stream=0))
    add("cai-stream-string", lambda: cai(shape, typestr, stream="s"))
    add("cai-stream-2**70", lambda: cai(shape, typestr, stream=2**70))
    add("cai-interface-list", lambda: CAI([1, 2, 3]))
    add("cai-interface-None", lambda: CAI(None))
    add("cai-interface-raises", lambda: CAI(RuntimeError("interface broke")))
    add("cai-version-missing", lambda: cai(shape, typestr, version=_DROP), "either")
    return v


def _operand_cases():
    for position in POSITIONS:
        for variant, make, kind in operand_faults(position):
            for entry in ("fn", "obj"):
                def call(position=position, make=make, entry=entry):
                    ops = base_ops(position)
                    ops[position] = make()
                    return problem_call(entry, ops)
                tokens = arg(position)
                if variant in ("host-among-device", "pinned-host-among-device", "device-id-7",
                               "device-disagrees-with-capsule") or variant.startswith("dtype-"):
                    tokens += arg("a")  # a mismatch between two operands may name the other one
                yield Case(f"operand/{variant}/{position}/{entry}", kind, call, tokens)
    # out= exists on the function form only; checking it may wait for the plan (that is, a GPU)
    for variant, make, _kind in operand_faults("out"):
        def call(make=make):
            ops = base_ops("out")
            ops["out"] = make()
            return problem_call("fn", ops)
        yield Case(f"operand/{variant}/out/fn", "either", call, arg("out"))
    for variant, make in (("readonly", lambda: operand("out", flags=1)),
                          ("overlaps-a", lambda: operand("out", data=BASE)),
                          ("row-major", lambda: operand("out", strides="C")),
                          ("misaligned-by-one-element", lambda: operand("out", data=BASE + 0x60004)),
                          ("wrong-shape", lambda: operand("out", shape=(N, M))),
                          ("batched-for-2d", lambda: operand("out", shape=(BATCH, M, N), strides="F"))):
        def call(make=make):
            ops = base_ops("out")
            ops["out"] = make()
            return problem_call("fn", ops)
        yield Case(f"out/{variant}/fn", "either", call, arg("out"))


def _shape_cases():
    """Well-formed arrays that do not fit together (nvmath-python refuses each)."""
    cases = {
        "K-mismatch": ({"b": operand("b", shape=(K + 1, N))}, arg("b") + arg("a")),
        "batch-mismatch": ({"a": operand("a", shape=(BATCH, M, K)), "b": operand("b", shape=(BATCH + 1, K, N))},
                           arg("b") + arg("a")),
        "c-wrong-M": ({"c": operand("c", shape=(M + 1, N))}, arg("c")),
        "c-wrong-N": ({"c": operand("c", shape=(M, N + 1))}, arg("c")),
        "c-1-D": ({"c": operand("c", shape=(M,), strides="C")}, arg("c")),
        "c-batch-mismatch": ({"a": operand("a", shape=(BATCH, M, K)), "c": operand("c", shape=(BATCH + 1, M, N))},
                             arg("c")),
        "bias-wrong-length": ({"bias": operand("bias", shape=(M + 1,))}, arg("bias")),
        "bias-(1,M)-2d-problem": ({"bias": operand("bias", shape=(1, M))}, arg("bias")),
        "bias-(M,2)": ({"bias": operand("bias", shape=(M, 2), strides="F")}, arg("bias")),
        "bias-batch-mismatch": ({"a": operand("a", shape=(BATCH, M, K)),
                                 "bias": operand("bias", shape=(BATCH + 1, M, 1))}, arg("bias")),
        "bias-strided": ({"bias": operand("bias", strides=(2,))}, arg("bias")),
        "relu_aux-float32": ({"relu_aux": operand("relu_aux", dtype="float32")}, arg("relu_aux")),
        "relu_aux-too-few-rows": ({"relu_aux": operand("relu_aux", shape=(RELU_LD - 8, N))}, arg("relu_aux")),
        "relu_aux-wrong-N": ({"relu_aux": operand("relu_aux", shape=(RELU_LD, N + 1))}, arg("relu_aux")),
        "relu_aux-row-major": ({"relu_aux": operand("relu_aux", strides="C")}, arg("relu_aux")),
        "relu_aux-batch-mismatch": ({"a": operand("a", shape=(BATCH, M, K)),
                                     "relu_aux": operand("relu_aux", shape=(BATCH + 1, RELU_LD, N), strides="F")},
                                    arg("relu_aux")),
        "gelu_aux-float16": ({"gelu_aux": operand("gelu_aux", dtype="float16")}, arg("gelu_aux")),
        "gelu_aux-unpadded-rows": ({"gelu_aux": operand("gelu_aux", shape=(M - 1, N))}, arg("gelu_aux")),
        "gelu_aux-row-major": ({"gelu_aux": operand("gelu_aux", strides="C")}, arg("gelu_aux")),
        "K=1-with-DRELU": ({"a": operand("a", shape=(M, 1)), "b": operand("b", shape=(1, N)),
                            "relu_aux": operand("relu_aux")}, arg("a") + arg("b") + ("K",)),
        "a-int8": ({"a": operand("a", dtype="int8"), "b": operand("b", dtype="int8")}, arg("a") + arg("b")),
        "e5m2-times-e5m2": ({"a": operand("a", shape=(16, 16), dtype="float8_e5m2"),
                             "b": operand("b", shape=(16, 16), dtype="float8_e5m2", strides="F")},
                            arg("a") + arg("b")),
        "float16-times-float32": ({"a": operand("a", dtype="float16")}, arg("a") + arg("b")),
        "a-on-device-1-b-on-0": ({"a": operand("a", device=(2, 1))}, arg("a") + arg("b")),
    }
    for name, (changes, tokens) in cases.items():
        for entry in ("fn", "obj"):
            def call(changes=changes, entry=entry):
                ops = base_ops()
                ops.update(changes)
                return problem_call(entry, ops)
            kind = "either" if name == "a-on-device-1-b-on-0" else "invalid"
            yield Case(f"shape/{name}/{entry}", kind, call, tokens)


def _valid_cases():
    """Calls nvmath-python accepts (issue 9): they must get as far as the GPU."""
    host = {"a": np.random.default_rng(0).standard_normal((M, K)).astype(np.float32),
            "b": np.random.default_rng(1).standard_normal((K, N)).astype(np.float32)}
    q = np.zeros(3, dtype=QUALIFIERS_DTYPE)
    q_conj = np.zeros(3, dtype=QUALIFIERS_DTYPE)
    q_conj[0]["is_conjugate"] = 1
    cases = {
        "plain": ({}, {}),
        "a-1-D": ({"a": operand("a", shape=(K,))}, {}),
        "b-1-D": ({"b": operand("b", shape=(K,))}, {}),
        "both-1-D": ({"a": operand("a", shape=(K,)), "b": operand("b", shape=(K,))}, {}),
        "batch-broadcast-b": ({"a": operand("a", shape=(BATCH, M, K))}, {}),
        "batch-broadcast-a": ({"b": operand("b", shape=(BATCH, K, N))}, {}),
        "two-batch-dims": ({"a": operand("a", shape=(2, BATCH, M, K)), "b": operand("b", shape=(2, BATCH, K, N))}, {}),
        "a-column-major": ({"a": operand("a", strides="F")}, {}),
        "a-padded-ld": ({"a": operand("a", strides=(K + 4, 1))}, {}),
        "c-row-major": ({"c": operand("c", strides="C")}, {}),
        "c-(M,1)-broadcast": ({"c": operand("c", shape=(M, 1))}, {}),
        "c-batched": ({"a": operand("a", shape=(BATCH, M, K)), "c": operand("c", shape=(BATCH, M, N), strides="F")}, {}),
        "c-2-D-batched-problem": ({"a": operand("a", shape=(BATCH, M, K)), "c": operand("c")}, {}),
        "beta=0": ({"c": operand("c")}, {"beta": 0.0}),
        "bias-(M,1)": ({"bias": operand("bias", shape=(M, 1), strides="F")}, {}),
        "bias-(M,)-batched-problem": ({"a": operand("a", shape=(BATCH, M, K)), "bias": operand("bias")}, {}),
        "bias-(B,M,1)": ({"a": operand("a", shape=(BATCH, M, K)),
                          "bias": operand("bias", shape=(BATCH, M, 1), strides="F")}, {}),
        "relu_aux-batched": ({"a": operand("a", shape=(BATCH, M, K)),
                              "relu_aux": operand("relu_aux", shape=(BATCH, RELU_LD, N), strides="F")}, {}),
        "relu_aux-2-D-batched-problem": ({"a": operand("a", shape=(BATCH, M, K)), "relu_aux": operand("relu_aux")}, {}),
        "gelu_aux-batched": ({"a": operand("a", shape=(BATCH, M, K)),
                              "gelu_aux": operand("gelu_aux", shape=(BATCH, GELU_LD, N), strides="F")}, {}),
        "float64": ({"a": operand("a", dtype="float64"), "b": operand("b", dtype="float64")}, {}),
        "float16": ({"a": operand("a", dtype="float16"), "b": operand("b", dtype="float16")}, {}),
        "bfloat16": ({"a": operand("a", dtype="bfloat16"), "b": operand("b", dtype="bfloat16")}, {}),
        "complex64": ({"a": operand("a", dtype="complex64"), "b": operand("b", dtype="complex64")}, {}),
        "complex128-conj-a": ({"a": operand("a", dtype="complex128"), "b": operand("b", dtype="complex128")},
                              {"qualifiers": q_conj}),
        "fp8-e4m3-scales-abd": ({"a": operand("a", shape=(16, 16), dtype="float8_e4m3fn"),
                                 "b": operand("b", shape=(16, 16), dtype="float8_e4m3fn", strides="F")},
                                {"quantization_scales": {"a": 1.0, "b": 2.0, "d": 0.5}}),
        "1x1x1": ({"a": operand("a", shape=(1, 1)), "b": operand("b", shape=(1, 1))}, {}),
        "M=1": ({"a": operand("a", shape=(1, K))}, {}),
        "alpha=None": ({}, {"alpha": None}),
        "alpha-numpy-scalar": ({}, {"alpha": np.float32(2.0)}),
        "alpha-negative": ({}, {"alpha": -1.5}),
        "stream=0": ({}, {"stream": 0}),
        "stream=1-legacy": ({}, {"stream": 1}),
        "stream=2-per-thread": ({}, {"stream": 2}),
        "stream-object-__cuda_stream__": ({}, {"stream": Stream(__cuda_stream__=lambda: (0, 0))}),
        "qualifiers-zeros": ({}, {"qualifiers": q}),
        "qualifiers-conj-a-real": ({}, {"qualifiers": q_conj}),
        "options-dict-compute-type-value": ({}, {"options": {"compute_type": 77}}),
        "options-blocking-true": ({}, {"options": {"blocking": True}}),
        "options-device_id": ({}, {"options": {"device_id": 0}}),
        "preferences-limit-4": ({}, {"preferences": {"limit": 4}}),
        "unversioned-capsule": ({"a": operand("a", versioned=False)}, {}),
        "old-producer": ({"a": OldProducer(**templates()["a"])}, {}),
        "readonly-a": ({"a": operand("a", flags=1)}, {}),
        "cai-operands": ({"a": cai((M, K)), "b": cai((K, N), data=(BASE + 0x10000, False))}, {}),
        "cai-complex64": ({"a": cai((M, K), "<c8"), "b": cai((K, N), "<c8", data=(BASE + 0x10000, False))}, {}),
        "numpy-host": ({"a": host["a"], "b": host["b"]}, {}),
        "numpy-host-complex": ({"a": host["a"].astype(np.complex64), "b": host["b"].astype(np.complex64)}, {}),
        "numpy-host-bias": ({"a": host["a"], "b": host["b"], "bias": np.ones(M, np.float32)}, {}),
        # negative strides in host memory are packed densely when staged (issue 22)
        "numpy-host-reversed-a": ({"a": host["a"][::-1], "b": host["b"]}, {}),
        "numpy-host-reversed-b-columns": ({"a": host["a"], "b": host["b"][:, ::-1]}, {}),
        "numpy-host-reversed-both-axes": ({"a": host["a"][::-1, ::-1], "b": host["b"][::-1]}, {}),
        "numpy-host-reversed-c": ({"a": host["a"], "b": host["b"], "c": np.ones((M, N), np.float32)[::-1]}, {}),
        "numpy-host-masked-nothing-masked": ({"a": np.ma.masked_array(host["a"]), "b": host["b"]}, {}),
    }
    for name, (changes, kwargs) in cases.items():
        for entry in ("fn", "obj"):
            def call(changes=changes, kwargs=kwargs, entry=entry):
                ops = base_ops()
                ops.update(changes)
                return problem_call(entry, ops, **dict(kwargs))
            yield Case(f"valid/{name}/{entry}", "valid", call)
    for name in ("RELU", "RELU_AUX", "GELU", "GELU_AUX", "BGRADA", "BGRADB", "RELU_AUX_BIAS", "DRELU_BGRAD",
                 "DGELU_BGRAD"):
        def call(name=name):
            ops = base_ops()
            if "BIAS" in name and "BGRAD" not in name:
                ops["bias"] = operand("bias")
            inputs = None
            if name.startswith("DRELU"):
                inputs = {"relu_aux": operand("relu_aux")}
            elif name.startswith("DGELU"):
                inputs = {"gelu_aux": operand("gelu_aux")}
            return problem_call("fn", ops, epilog=name, epilog_inputs=inputs)
        yield Case(f"valid/epilog-{name}/fn", "valid", call)


class _OtherEpilog(enum.IntEnum):  # a caller's own enum with cuBLASLt's values (nvmath-python's, say)
    RELU = 2


def _scalar_epilog_cases():
    def scalars(name):
        return {
            "string-number": ("2", "either"), "string-word": ("abc", "invalid"), "bytes": (b"1", "either"),
            "bool-True": (True, "either"), "nan": (float("nan"), "either"), "inf": (float("inf"), "either"),
            "-inf": (float("-inf"), "either"), "1e300": (1e300, "either"), "int-2**1000": (2**1000, "invalid"),
            "int-2**70": (2**70, "either"), "complex-for-real": (complex(1, 1), "invalid"),
            "list": ([1.0], "invalid"), "tuple": ((1.0, 2.0), "invalid"), "dict": ({"x": 1}, "invalid"),
            "object": (object(), "invalid"), "numpy-2-elements": (np.array([1.0, 2.0]), "invalid"),
            "numpy-0-d": (np.array(2.0), "valid"), "numpy-1-element": (np.array([2.0]), "valid"),
            "numpy-masked": (np.ma.masked, "invalid"), "decimal": (decimal.Decimal("1.5"), "either"),
            "fraction": (fractions.Fraction(1, 3), "either"), "numpy-int64": (np.int64(3), "either"),
            "numpy-complex-for-real": (np.complex64(1 + 2j), "invalid"),
            "float-subclass-raising": (_BadFloat(), "invalid"),
        }
    for name in ("alpha", "beta"):
        for variant, (value, kind) in scalars(name).items():
            for entry in ("fn", "obj"):
                def call(name=name, value=value, entry=entry):
                    return problem_call(entry, base_ops("c"), **{name: value})
                yield Case(f"scalar/{name}-{variant}/{entry}", kind, call, arg(name))
    for entry in ("fn", "obj"):
        yield Case(f"scalar/beta-without-c/{entry}", "either",
                   lambda entry=entry: problem_call(entry, base_ops(), beta=0.5), arg("beta") + arg("c"))
        yield Case(f"scalar/c-without-beta/{entry}", "either",
                   lambda entry=entry: problem_call(entry, {**base_ops("c")}, beta=None), arg("beta") + arg("c"))

    epilogs = {"unknown-name": ("NOT_AN_EPILOG", "invalid"), "empty-string": ("", "invalid"),
               "lowercase-name": ("relu", "either"), "value-12345": (12345, "invalid"), "value-0": (0, "invalid"),
               "value--1": (-1, "invalid"), "value-2**70": (2**70, "invalid"), "float": (2.5, "invalid"),
               "bool": (True, "invalid"), "bytes": (b"RELU", "invalid"), "list": ([2], "invalid"),
               "object": (object(), "invalid"), "other-intenum-same-value": (_OtherEpilog.RELU, "valid"),
               "numpy-int64-RELU": (np.int64(2), "valid"), "numpy-uint8-RELU": (np.uint8(2), "valid"),
               "numpy-float64": (np.float64(2.0), "invalid"), "numpy-bool": (np.True_, "invalid"),
               "int-value-of-RELU": (2, "valid"), "name-with-spaces": (" RELU ", "either")}
    for variant, (value, kind) in epilogs.items():
        for entry in ("fn", "obj"):
            yield Case(f"epilog/{variant}/{entry}", kind,
                       lambda value=value, entry=entry: problem_call(entry, base_ops(), epilog=value), arg("epilog"))

    bias = lambda: operand("bias")  # noqa: E731
    inputs = {"list": (lambda: [bias()], "BIAS", "invalid"), "string": (lambda: "bias", "BIAS", "invalid"),
              "missing-bias": (lambda: {}, "BIAS", "invalid"), "None-for-BIAS": (lambda: None, "BIAS", "invalid"),
              # keys an epilog does not take are ignored with a warning, as nvmath-python ignores them
              "extra-key": (lambda: {"bias": bias(), "extra": bias()}, "BIAS", "either"),
              "int-key": (lambda: {1: bias()}, "BIAS", "invalid"),
              "None-key": (lambda: {None: bias()}, "BIAS", "invalid"),
              "bias-None": (lambda: {"bias": None}, "BIAS", "invalid"),
              "relu_aux-for-BIAS": (lambda: {"relu_aux": operand("relu_aux")}, "BIAS", "invalid"),
              "bias-for-RELU": (lambda: {"bias": bias()}, "RELU", "either"),
              "bias-without-epilog": (lambda: {"bias": bias()}, None, "either"),
              "nested-dict": (lambda: {"bias": {"bias": bias()}}, "BIAS", "invalid"),
              "bias-and-relu_aux-for-DRELU": (lambda: {"bias": bias(), "relu_aux": operand("relu_aux")}, "DRELU",
                                              "either")}
    for variant, (make, epilog, kind) in inputs.items():
        for entry in ("fn", "obj"):
            yield Case(f"epilog_inputs/{variant}/{entry}", kind,
                       lambda make=make, epilog=epilog, entry=entry: problem_call(
                           entry, base_ops(), epilog=epilog, epilog_inputs=make()),
                       arg("epilog_inputs") + arg("bias") + ("epilog_inputs",))


class _BadFloat(float):
    def __float__(self):
        _raises(_Boom("no float for you"))()


def _option_cases():
    options = {
        "string": ("fast", "invalid", ()), "int": (3, "invalid", ()), "list": ([1], "invalid", ()),
        "object": (object(), "invalid", ()), "unknown-key": ({"nope": 1}, "invalid", ("nope",)),
        "compute_type-bad-name": ({"compute_type": "tf33"}, "invalid", ("compute_type",)),
        "compute_type-negative": ({"compute_type": -5}, "invalid", ("compute_type",)),
        "compute_type-2**70": ({"compute_type": 2**70}, "invalid", ("compute_type",)),
        "compute_type-float": ({"compute_type": 68.5}, "invalid", ("compute_type",)),
        "compute_type-16F-for-float32": ({"compute_type": 64}, "invalid", ("compute_type",)),
        "compute_type-64F-for-float32": ({"compute_type": 70}, "invalid", ("compute_type",)),
        "compute_type-object": ({"compute_type": object()}, "invalid", ("compute_type",)),
        "scale_type-999": ({"scale_type": 999}, "invalid", ("scale_type",)),
        "scale_type-string": ({"scale_type": "x"}, "invalid", ("scale_type",)),
        "scale_type-64F-for-float32": ({"scale_type": 1}, "invalid", ("scale_type", "compute_type")),
        "result_type-bad-name": ({"result_type": "float99"}, "invalid", ("result_type",)),
        "result_type-object": ({"result_type": object()}, "invalid", ("result_type",)),
        "result_type-12345": ({"result_type": 12345}, "invalid", ("result_type",)),
        "result_type-int64-dtype": ({"result_type": np.dtype("int64")}, "invalid", ("result_type",)),
        "result_amax-for-float32": ({"result_amax": True}, "invalid", ("result_amax",)),
        "result_amax-string": ({"result_amax": "yes"}, "either", ("result_amax",)),
        "inplace-without-c": ({"inplace": True}, "invalid", ("inplace", "c")),
        "blocking-sometimes": ({"blocking": "sometimes"}, "invalid", ("blocking",)),
        "blocking-False": ({"blocking": False}, "invalid", ("blocking",)),
        "device_id--1": ({"device_id": -1}, "either", ("device_id",)),
        "device_id-string": ({"device_id": "0"}, "either", ("device_id",)),
        "device_id-2**70": ({"device_id": 2**70}, "either", ("device_id",)),
        "memory_limit-words": ({"memory_limit": "lots"}, "invalid", ("memory_limit",)),
        "memory_limit-negative": ({"memory_limit": -5}, "either", ("memory_limit",)),
        "logger-string": ({"logger": "x"}, "either", ("logger",)),
        "sm_count_target--1": ({"sm_count_target": -1}, "either", ("sm_count_target",)),
        "handle-string": ({"handle": "x"}, "either", ("handle",)),
        "allocator-string": ({"allocator": "x"}, "invalid", ("allocator",)),
    }
    for variant, (value, kind, fields) in options.items():
        tokens = arg("options") + tuple(rf"(?i)\b{f}\b" for f in fields)
        for entry in ("fn", "obj"):
            yield Case(f"options/{variant}/{entry}", kind,
                       lambda value=value, entry=entry: problem_call(entry, base_ops(), options=value), tokens)

    preferences = {
        "string": ("fast", "invalid", ()), "list": ([1], "invalid", ()),
        "unknown-key": ({"nope": 1}, "invalid", ("nope",)), "limit--1": ({"limit": -1}, "invalid", ("limit",)),
        "limit-0": ({"limit": 0}, "either", ("limit",)), "limit-string": ({"limit": "8"}, "invalid", ("limit",)),
        "limit-2**40": ({"limit": 2**40}, "invalid", ("limit",)), "limit-float": ({"limit": 1.5}, "invalid", ("limit",)),
        "max_waves_count-string": ({"max_waves_count": "x"}, "invalid", ("max_waves_count",)),
        "max_waves_count--1": ({"max_waves_count": -1.0}, "either", ("max_waves_count",)),
        "reduction_scheme_mask-2**70": ({"reduction_scheme_mask": 2**70}, "invalid", ("reduction_scheme_mask",)),
        "numerical_impl_mask--1": ({"numerical_impl_mask": -1}, "either", ("numerical_impl_mask",)),
        "numerical_impl_mask-string": ({"numerical_impl_mask": "x"}, "invalid", ("numerical_impl_mask",)),
        "workspace_limit--1": ({"workspace_limit": -1}, "invalid", ("workspace_limit",)),
        "workspace_limit-2**70": ({"workspace_limit": 2**70}, "invalid", ("workspace_limit",)),
        "epilog-string": ({"epilog": "x"}, "invalid", ("epilog",)),
        "epilog-aux_type-999": ({"epilog": {"aux_type": 999}}, "either", ("aux_type", "epilog")),
    }
    for variant, (value, kind, fields) in preferences.items():
        tokens = arg("preferences") + tuple(rf"(?i)\b{f}\b" for f in fields)
        for entry in ("fn", "obj"):
            yield Case(f"preferences/{variant}/{entry}", kind,
                       lambda value=value, entry=entry: problem_call(entry, base_ops(), preferences=value), tokens)

    def qualifiers(n=3, shape=None, conj=(), dtype=QUALIFIERS_DTYPE):
        q = np.zeros(shape or (n,), dtype=dtype)
        for i in conj:
            q[i]["is_conjugate"] = 1
        return q
    quals = {"string": (lambda: "conj", "invalid"), "list": (lambda: [0, 0, 0], "invalid"),
             "float-array": (lambda: np.zeros(3), "invalid"), "length-2": (lambda: qualifiers(2), "invalid"),
             "length-4": (lambda: qualifiers(4), "invalid"), "2-D": (lambda: qualifiers(shape=(3, 1)), "invalid"),
             "conjugate-c": (lambda: qualifiers(conj=(2,)), "invalid"),
             "int-array": (lambda: np.zeros(3, dtype=np.int32), "invalid"),
             "dict-of-3": (lambda: {"x": 0, "y": 0, "z": 0}, "invalid"),
             "float-field-0.5": (lambda: np.full(3, 0.5, dtype=[("is_conjugate", "<f8")]), "invalid")}
    for variant, (make, kind) in quals.items():
        for entry in ("fn", "obj"):
            yield Case(f"qualifiers/{variant}/{entry}", kind,
                       lambda make=make, entry=entry: problem_call(entry, base_ops("c"), qualifiers=make()),
                       arg("qualifiers"))

    fp8 = lambda: {"a": operand("a", shape=(16, 16), dtype="float8_e4m3fn"),  # noqa: E731
                   "b": operand("b", shape=(16, 16), dtype="float8_e4m3fn", strides="F")}
    scale_array = lambda shape, dtype="float32": operand("bias", shape=shape, dtype=dtype,  # noqa: E731
                                                        strides="C", data=BASE + 0x70000)
    scales = {"string": (lambda: "x", "invalid"), "list": (lambda: [1.0, 1.0], "invalid"),
              "unknown-key": (lambda: {"a": 1.0, "b": 1.0, "d": 1.0, "z": 1.0}, "invalid"),
              "a-string": (lambda: {"a": "x", "b": 1.0, "d": 1.0}, "invalid"),
              "a-object": (lambda: {"a": object(), "b": 1.0, "d": 1.0}, "invalid"),
              "a-2**1000": (lambda: {"a": 2**1000, "b": 1.0, "d": 1.0}, "invalid"),
              "a-complex": (lambda: {"a": 1j, "b": 1.0, "d": 1.0}, "invalid"),
              "a-bool": (lambda: {"a": True, "b": 1.0, "d": 1.0}, "either"),
              "a-nan": (lambda: {"a": float("nan"), "b": 1.0, "d": 1.0}, "either"),
              "missing-b": (lambda: {"a": 1.0, "d": 1.0}, "either"),
              "missing-d-for-fp8-result": (lambda: {"a": 1.0, "b": 1.0}, "either"),
              "a-array-2-elements": (lambda: {"a": scale_array((2,)), "b": 1.0, "d": 1.0}, "invalid"),
              "a-array-float16": (lambda: {"a": scale_array((1,), "float16"), "b": 1.0, "d": 1.0}, "invalid"),
              "a-array-1-element": (lambda: {"a": scale_array((1,)), "b": 1.0, "d": 1.0}, "valid"),
              "a-array-0-d": (lambda: {"a": scale_array(()), "b": 1.0, "d": 1.0}, "valid"),
              "a-numpy-float32": (lambda: {"a": np.float32(0.5), "b": 1.0, "d": 1.0}, "either")}
    for variant, (make, kind) in scales.items():
        for entry in ("fn", "obj"):
            yield Case(f"quantization_scales/{variant}/{entry}", kind,
                       lambda make=make, entry=entry: problem_call(entry, fp8(), quantization_scales=make()),
                       arg("quantization_scales") + (r"quantization_scales\[", r"\bscale"))
    for entry in ("fn", "obj"):
        yield Case(f"quantization_scales/for-float32/{entry}", "either",
                   lambda entry=entry: problem_call(entry, base_ops(), quantization_scales={"a": 1.0, "b": 1.0}),
                   arg("quantization_scales"))

    streams = {"string": ("s", "invalid"), "-1": (-1, "invalid"), "2**70": (2**70, "invalid"),
               "2**64": (2**64, "invalid"), "float": (1.5, "invalid"), "bool": (True, "invalid"),
               "object": (object(), "invalid"), "list": ([0], "invalid"),
               "cuda_stream-string": (Stream(cuda_stream="x"), "invalid"),
               "ptr-None": (Stream(ptr=None), "invalid"),
               "__cuda_stream__-garbage": (Stream(__cuda_stream__=lambda: ("a",)), "invalid"),
               "__cuda_stream__-raises": (Stream(__cuda_stream__=_raises(_Boom("no stream"))), "invalid"),
               "__cuda_stream__-negative": (Stream(__cuda_stream__=lambda: (0, -5)), "invalid"),
               "getPtr-raises": (Stream(getPtr=_raises(_Boom("no ptr"))), "invalid"),
               "getPtr-string": (Stream(getPtr=lambda: "x"), "invalid")}
    for variant, (value, kind) in streams.items():
        for entry in ("fn", "obj"):
            yield Case(f"stream/{variant}/{entry}", kind,
                       lambda value=value, entry=entry: problem_call(entry, base_ops(), stream=value), arg("stream"))


def _lifecycle_cases():
    import_nv = lambda: __import__("nvblaslt")  # noqa: E731

    def matmul_object():
        return import_nv().Matmul(operand("a"), operand("b"))

    def execute_before_plan():
        return matmul_object().execute()

    def autotune_before_plan():
        return matmul_object().autotune()

    def reset_before_plan():
        return matmul_object().reset_operands(a=operand("a"))

    def plan_after_free():
        mm = matmul_object()
        mm.free()
        return mm.plan()

    def plan_algorithms(value):
        return lambda: matmul_object().plan(algorithms=value)

    def reset_wrong_shape():
        mm = matmul_object()
        return mm.reset_operands(a=operand("a", shape=(M + 1, K)))

    yield Case("lifecycle/execute-before-plan", "invalid", execute_before_plan, (r"\bplan\b",))
    yield Case("lifecycle/autotune-before-plan", "invalid", autotune_before_plan, (r"\bplan\b",))
    yield Case("lifecycle/reset_operands-before-plan", "optional", reset_before_plan, (r"\bplan\b",) + arg("a"))
    yield Case("lifecycle/reset_operands-wrong-shape", "either", reset_wrong_shape, arg("a") + (r"\bplan\b",))
    yield Case("lifecycle/plan-after-free", "invalid", plan_after_free, (r"\bfree", r"\bclosed", r"released"))
    yield Case("lifecycle/plan-algorithms-string", "invalid", plan_algorithms("fast"), arg("algorithms"))
    yield Case("lifecycle/plan-algorithms-objects", "invalid", plan_algorithms([object()]), arg("algorithms"))
    yield Case("lifecycle/plan-algorithms-empty", "invalid", plan_algorithms([]), arg("algorithms"))
    yield Case("lifecycle/plan-algorithms-ints", "invalid", plan_algorithms([1, 2]), arg("algorithms"))


def _descriptor_cases():
    def lt():
        import nvblaslt

        return nvblaslt.library().api

    def layout(**changes):
        import nvblaslt

        kwargs = dict(data_type=lt().CUDA_R_32F, rows=4, cols=4, ld=4)
        extra = {k: changes.pop(k) for k in ("order", "batch_count", "batch_stride") if k in changes}
        kwargs.update(changes)
        return nvblaslt.MatrixLayout(kwargs["data_type"], kwargs["rows"], kwargs["cols"], kwargs["ld"], **extra)

    yield Case("MatrixLayout/valid", "ok", lambda: layout())
    yield Case("MatrixLayout/valid-batched", "ok", lambda: layout(batch_count=3, batch_stride=16))
    yield Case("MatrixLayout/valid-order-row", "ok", lambda: layout(order=1))
    bad_extents = {"2**64+4": 2**64 + 4, "2**64": 2**64, "2**63": 2**63, "-1": -1, "float": 1.5, "string": "3",
                   "None": None, "bool": True, "numpy-float": np.float64(4.0)}
    for name in ("rows", "cols", "ld"):
        for variant, value in bad_extents.items():
            kind = "optional" if variant == "bool" else "invalid"
            yield Case(f"MatrixLayout/{name}-{variant}", kind, lambda name=name, value=value: layout(**{name: value}),
                       arg(name) + (rf"\b{name}\b", name.upper()))
    yield Case("MatrixLayout/rows-numpy-int", "ok", lambda: layout(rows=np.int64(4)))
    yield Case("MatrixLayout/ld-less-than-rows", "optional", lambda: layout(ld=2), arg("ld") + ("LD",))
    for variant, value, kind in (("9999", 9999, "any"), ("-1", -1, "any"), ("string", "CUDA_R_32F", "optional"),
                                 ("float", 1.5, "invalid"), ("2**40", 2**40, "invalid")):
        yield Case(f"MatrixLayout/data_type-{variant}", kind, lambda value=value: layout(data_type=value),
                   arg("data_type") + ("type", "TYPE"))
    for name, values in (("order", {"99": (99, "any"), "-1": (-1, "any"), "string": ("ROW", "optional"),
                                    "2**40": (2**40, "invalid")}),
                         ("batch_count", {"-1": (-1, "invalid"), "0": (0, "optional"), "2**40": (2**40, "optional"),
                                          "float": (1.5, "invalid"), "2**63": (2**63, "invalid")}),
                         ("batch_stride", {"2**64": (2**64, "invalid"), "float": (1.5, "invalid"),
                                           "string": ("x", "invalid")})):
        for variant, (value, kind) in values.items():
            extra = {"batch_count": 2} if name == "batch_stride" else {}
            yield Case(f"MatrixLayout/{name}-{variant}", kind,
                       lambda name=name, value=value, extra=extra: layout(**{name: value}, **extra),
                       arg(name) + (name.upper(), {"batch_stride": "STRIDED_BATCH_OFFSET"}.get(name, name.upper())))

    def desc():
        import nvblaslt

        return nvblaslt.MatmulDesc(lt().CUBLAS_COMPUTE_32F, lt().CUDA_R_32F)

    def make_desc(compute, scale):
        def make():
            import nvblaslt

            return nvblaslt.MatmulDesc(compute() if callable(compute) else compute,
                                       scale() if callable(scale) else scale)
        return make
    yield Case("MatmulDesc/valid", "ok", lambda: desc())
    for variant, value, kind in (("9999", 9999, "any"), ("string", "x", "invalid"), ("float", 1.5, "invalid"),
                                 ("2**70", 2**70, "invalid"), ("None", None, "invalid")):
        yield Case(f"MatmulDesc/compute_type-{variant}", kind,
                   make_desc(value, lambda: lt().CUDA_R_32F), arg("compute_type") + ("compute",))
        yield Case(f"MatmulDesc/scale_type-{variant}", kind,
                   make_desc(lambda: lt().CUBLAS_COMPUTE_32F, value), arg("scale_type") + ("scale",))
    set_cases = {
        "attribute-unknown-name": ("NOPE", 1, "invalid", ("attribute", "NOPE")),
        "attribute-int": (12345, 1, "invalid", ("attribute",)),
        "attribute-None": (None, 1, "invalid", ("attribute",)),
        "attribute-float": (1.5, 1, "invalid", ("attribute",)),
        "attribute-of-another-descriptor": ("MATRIX_LAYOUT_ROWS", 1, "invalid", ("attribute", "MATRIX_LAYOUT_ROWS")),
        "EPILOGUE-2**70": ("EPILOGUE", 2**70, "invalid", ("EPILOGUE",)),
        "EPILOGUE--1": ("EPILOGUE", -1, "invalid", ("EPILOGUE",)),
        "EPILOGUE-string": ("EPILOGUE", "RELU", "optional", ("EPILOGUE",)),
        "EPILOGUE-None": ("EPILOGUE", None, "invalid", ("EPILOGUE",)),
        "EPILOGUE-float": ("EPILOGUE", 1.5, "invalid", ("EPILOGUE",)),
        "EPILOGUE-list": ("EPILOGUE", [1], "invalid", ("EPILOGUE",)),
        "EPILOGUE-99999": ("EPILOGUE", 99999, "any", ("EPILOGUE",)),
        "BIAS_POINTER--1": ("BIAS_POINTER", -1, "invalid", ("BIAS_POINTER",)),
        "BIAS_POINTER-2**64": ("BIAS_POINTER", 2**64, "invalid", ("BIAS_POINTER",)),
        "BIAS_POINTER-string": ("BIAS_POINTER", "x", "invalid", ("BIAS_POINTER",)),
        "BIAS_POINTER-float": ("BIAS_POINTER", 1.5, "invalid", ("BIAS_POINTER",)),
        "BIAS_POINTER-None": ("BIAS_POINTER", None, "ok", ()),
        "EPILOGUE_AUX_LD-float": ("EPILOGUE_AUX_LD", 1.5, "invalid", ("EPILOGUE_AUX_LD",)),
        "EPILOGUE_AUX_LD-2**63": ("EPILOGUE_AUX_LD", 2**63, "invalid", ("EPILOGUE_AUX_LD",)),
        "EPILOGUE_AUX_LD-bool": ("EPILOGUE_AUX_LD", True, "invalid", ("EPILOGUE_AUX_LD",)),
        "EPILOGUE_AUX_LD-numpy-int": ("EPILOGUE_AUX_LD", np.int64(256), "ok", ()),
        "TRANSA-list": ("TRANSA", [1], "invalid", ("TRANSA",)),
        "TRANSA-99": ("TRANSA", 99, "any", ("TRANSA",)),
        "A_SCALE_POINTER-string": ("A_SCALE_POINTER", "x", "invalid", ("A_SCALE_POINTER",)),
        "lowercase-name": ("epilogue", 2, "ok", ()),
    }
    for variant, (attribute, value, kind, tokens) in set_cases.items():
        yield Case(f"MatmulDesc.set/{variant}", kind,
                   lambda attribute=attribute, value=value: desc().set(attribute, value), tokens)

    def set_after_close():
        d = desc()
        d.close()
        return d.set("EPILOGUE", 2)

    def get_unknown():
        return desc().get("NOPE")
    yield Case("MatmulDesc.set/after-close", "invalid", set_after_close, ("closed", "MatmulDesc"))
    yield Case("MatmulDesc.get/unknown", "invalid", get_unknown, ("attribute", "NOPE"))

    def preference(value):
        def make():
            import nvblaslt

            return nvblaslt.MatmulPreference(max_workspace_bytes=value)
        return make
    for variant, value, kind in (("-1", -1, "invalid"), ("2**64", 2**64, "invalid"), ("string", "x", "invalid"),
                                 ("float", 1.5, "invalid"), ("valid", 1 << 20, "ok")):
        yield Case(f"MatmulPreference/max_workspace_bytes-{variant}", kind, preference(value),
                   arg("max_workspace_bytes") + ("MAX_WORKSPACE_BYTES",))


def _environment_cases():
    """A process where another library has set its own ctypes prototypes on the shared
    ``ctypes.pythonapi`` capsule functions (a common idiom): nvblaslt must not depend on them."""
    def call():
        import nvblaslt

        try:  # nvblaslt has read a capsule (and set whatever it sets) before the other library comes along
            problem_call("fn", base_ops())
        except nvblaslt.NvblasltError:
            pass
        api = ctypes.pythonapi
        functions = (api.PyCapsule_IsValid, api.PyCapsule_GetPointer, api.PyCapsule_New, api.PyCapsule_GetName)
        saved = [(f, f.argtypes, f.restype) for f in functions]
        api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        api.PyCapsule_GetPointer.argtypes, api.PyCapsule_GetPointer.restype = [ctypes.c_void_p, ctypes.c_char_p], \
            ctypes.c_size_t
        api.PyCapsule_New.argtypes = [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
        try:
            return problem_call("fn", base_ops())
        finally:
            for f, argtypes, restype in saved:
                f.argtypes, f.restype = argtypes, restype
    yield Case("environment/pythonapi-prototypes-set-by-another-library/fn", "valid", call)


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _masked(shape, dtype=np.float32):
    """A host array with one element masked (a NumPy masked array nvblaslt must not multiply)."""
    mask = np.zeros(shape, bool)
    mask.flat[0] = True
    return np.ma.masked_array(np.ones(shape, dtype), mask=mask)


def _host_ops(**changes) -> dict:
    ops = {"a": np.ones((M, K), np.float32), "b": np.ones((K, N), np.float32)}
    ops.update(changes)
    return ops


def _issue22_cases():
    """Issue 22: inputs that were multiplied silently (masked arrays), escaped NvblasltError, were
    accepted and ignored, or refused though meaningful (reversed host arrays, a CPU tensor as alpha,
    a NumPy integer as epilog)."""
    import_nv = lambda: __import__("nvblaslt")  # noqa: E731

    # masked NumPy arrays, wherever a host array is read
    for position, shape in (("a", (M, K)), ("b", (K, N)), ("c", (M, N))):
        for entry in ("fn", "obj"):
            yield Case(f"masked/{position}/{entry}", "invalid",
                       lambda position=position, shape=shape, entry=entry: problem_call(
                           entry, _host_ops(**{position: _masked(shape)})), arg(position))
    for entry in ("fn", "obj"):
        yield Case(f"masked/bias/{entry}", "invalid",
                   lambda entry=entry: problem_call(entry, base_ops(), epilog="BIAS",
                                                    epilog_inputs={"bias": _masked((M,))}), arg("bias"))
        yield Case(f"masked/quantization_scales-a/{entry}", "invalid",
                   lambda entry=entry: problem_call(
                       entry, {"a": operand("a", shape=(16, 16), dtype="float8_e4m3fn"),
                               "b": operand("b", shape=(16, 16), dtype="float8_e4m3fn", strides="F")},
                       quantization_scales={"a": _masked((1,)), "b": 1.0}),
                   arg("quantization_scales") + (r"quantization_scales\[",))
        for name in ("alpha", "beta"):
            yield Case(f"masked/{name}-1-element/{entry}", "invalid",
                       lambda name=name, entry=entry: problem_call(entry, base_ops("c"), **{name: _masked((1,))}),
                       arg(name))
    yield Case("masked/bias-with-host-operands/fn", "invalid",
               lambda: problem_call("fn", _host_ops(), epilog="BIAS", epilog_inputs={"bias": _masked((M,))}),
               arg("bias"))
    # out= with host operands is refused ("not available for host operands") once the plan exists
    yield Case("masked/out-with-host-operands/fn", "either",
               lambda: problem_call("fn", _host_ops(out=_masked((M, N)))), arg("out"))

    def reset_masked():
        mm = import_nv().Matmul(operand("a"), operand("b"))
        return mm.reset_operands(a=_masked((M, K)))
    yield Case("masked/reset_operands-a/obj", "invalid", reset_masked, arg("a"))

    # errors that escaped NvblasltError
    for variant, level in (("string", "x"), ("99", 99), ("-1", -1), ("bool", True), ("float", 2.5),
                           ("None", None)):
        yield Case(f"escape/set_log_level-{variant}", "invalid",
                   lambda level=level: import_nv().set_log_level(level), arg("level"))
    yield Case("escape/set_log_level-numpy-int", "ok", lambda: import_nv().set_log_level(np.int64(0)))
    for variant, device in (("-1", -1), ("cuda:0", "cuda:0"), ("float", 0.0), ("bool", True), ("2**40", 2**40)):
        yield Case(f"meaningless/Handle-{variant}", "invalid", lambda device=device: import_nv().Handle(device),
                   arg("device"))
    if _has_torch():
        def nt():
            import nvblaslt.torch

            return nvblaslt.torch

        def torch():
            import torch

            return torch
        for variant, (call, name) in {
            "linear-numpy-x": (lambda: nt().linear(np.ones((2, K)), torch().ones(N, K)), "x"),
            "linear-numpy-weight": (lambda: nt().linear(torch().ones(2, K), np.ones((N, K))), "weight"),
            "linear-numpy-bias": (lambda: nt().linear(torch().ones(2, K), torch().ones(N, K), np.ones(N)), "bias"),
            "linear-list-x": (lambda: nt().linear([[1.0] * K], torch().ones(N, K)), "x"),
            "fuse-int": (lambda: nt().fuse(5), "module"),
            "fuse-list": (lambda: nt().fuse([torch().nn.Linear(2, 2)]), "module"),
            "FusedLinear-in_features--1": (lambda: nt().FusedLinear(-1, 4), "in_features"),
            "FusedLinear-out_features--1": (lambda: nt().FusedLinear(4, -1), "out_features"),
            "FusedLinear-in_features-float": (lambda: nt().FusedLinear(4.0, 4), "in_features"),
        }.items():
            yield Case(f"escape/torch-{variant}", "invalid", call, arg(name))
        for variant, iterations in (("0", 0), ("-1", -1), ("float", 1.5), ("bool", True), ("string", "5")):
            yield Case(f"meaningless/torch-autotune-iterations-{variant}", "invalid",
                       lambda iterations=iterations: nt().autotune(iterations=iterations), arg("iterations"))
        for variant, make in (("torch-0-d", lambda: torch().tensor(2.0)), ("torch-1-element", lambda: torch().ones(1)),
                              ("torch-requires-grad", lambda: torch().tensor(2.0, requires_grad=True))):
            for entry in ("fn", "obj"):
                yield Case(f"scalar/alpha-{variant}/{entry}", "valid",
                           lambda make=make, entry=entry: problem_call(entry, base_ops(), alpha=make()))
        for entry in ("fn", "obj"):
            yield Case(f"scalar/alpha-torch-2-elements/{entry}", "invalid",
                       lambda entry=entry: problem_call(entry, base_ops(), alpha=torch().ones(2)), arg("alpha"))
    for entry in ("fn", "obj"):
        yield Case(f"scalar/alpha-gpu-scalar/{entry}", "valid",  # its value copied back, as nvmath-python reads it
                   lambda entry=entry: problem_call(entry, base_ops(), alpha=FakeGpuScalar()))

    # accepted but meaningless: refused where given, or (what nvmath-python accepts) said
    for entry in ("fn", "obj"):
        yield Case(f"meaningless/fast_accumulation-float32/{entry}", "valid",
                   lambda entry=entry: problem_call(entry, base_ops(), options={"fast_accumulation": True}),
                   warns=(r"fast_accumulation.*fp8",))
        for name, keyword, option in (("compute_type", "tf32", "float32"), ("result_type", "float32", "float32")):
            yield Case(f"meaningless/{name}-keyword-and-option/{entry}", "invalid",
                       lambda entry=entry, name=name, keyword=keyword, option=option: problem_call(
                           entry, base_ops(), options={name: option}, **{name: keyword}), arg(name))
        q = np.zeros(3, dtype=QUALIFIERS_DTYPE)
        q[0]["is_conjugate"] = 2
        yield Case(f"meaningless/qualifiers-is_conjugate-2/{entry}", "invalid",
                   lambda entry=entry, q=q: problem_call(entry, base_ops(), qualifiers=q), arg("qualifiers"))
    for variant, value in (("bogus", "bogus"), ("COMPUTE_32I", 72), ("-5", -5), ("float", 68.5), ("object", object())):
        yield Case(f"meaningless/MatmulOptions-compute_type-{variant}", "invalid",
                   lambda value=value: import_nv().MatmulOptions(compute_type=value), (r"^options\.compute_type:",))
    for variant, value in (("numpy-int", np.int32(68)), ("alias", "tf32"), ("name", "CUBLAS_COMPUTE_32F")):
        yield Case(f"meaningless/MatmulOptions-compute_type-{variant}", "ok",
                   lambda value=value: import_nv().MatmulOptions(compute_type=value))


def build_cases() -> dict[str, Case]:
    cases = {}
    for group in (_operand_cases, _shape_cases, _valid_cases, _scalar_epilog_cases, _option_cases,
                  _lifecycle_cases, _descriptor_cases, _environment_cases, _issue22_cases):
        for case in group():
            assert case.id not in cases, case.id
            cases[case.id] = case
    return cases


# ---- the worker: run cases by id, one JSON line per event -------------------------------------------
NO_GPU = re.compile(r"driver|no (usable |CUDA |NVIDIA )*(GPU|device)|CUDA_ERROR_NO_DEVICE|NoDevice|"
                    r"NOT_INITIALIZED|needs? an? (NVIDIA |CUDA )?GPU|without an? (NVIDIA |CUDA )?GPU|GPU.*not (found|available)",
                    re.IGNORECASE)


def describe_outcome(exc: BaseException | None) -> dict:
    if exc is None:
        return {"outcome": "returned"}
    try:
        import nvblaslt

        nv = isinstance(exc, nvblaslt.NvblasltError)
        gpu_error = isinstance(exc, (nvblaslt.CudaError,)) or (
            isinstance(exc, nvblaslt.CublasLtError) and "NOT_INITIALIZED" in str(exc))
    except Exception:  # nvblaslt itself failed to import
        nv, gpu_error = False, False
    message = str(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
    return {"outcome": "raised", "type": type(exc).__name__, "nvblaslt": nv,
            "standard": isinstance(exc, (ValueError, TypeError)),
            "stand_in": bool(getattr(exc, "from_stand_in", False)),
            "no_gpu": bool(gpu_error or (nv and NO_GPU.search(message))), "message": message[:600], "where": where}


def _limit_memory() -> None:
    """Cap the address space, so that a case reading a huge claimed shape fails in this worker
    (MemoryError or a crash) instead of swapping the machine. NVBLASLT_FUZZ_MEMORY_GB, default 4."""
    import os

    try:
        import resource
    except ImportError:
        return
    limit = int(float(os.environ.get("NVBLASLT_FUZZ_MEMORY_GB", "4")) * (1 << 30))
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run(ids: list[str]) -> None:
    import gc

    _limit_memory()
    cases = build_cases()
    out = sys.stdout
    for case_id in ids:
        print(json.dumps({"id": case_id, "event": "start"}), file=out, flush=True)
        with warnings.catch_warnings(record=True) as given:
            warnings.simplefilter("always")
            try:
                cases[case_id].call()
            except BaseException as exc:  # noqa: BLE001 — recording what was raised is the point
                record = describe_outcome(exc)
            else:
                record = describe_outcome(None)
            gc.collect()  # finalizers of what the case made run now, attributed to this case
        record.update(id=case_id, event="done", warnings=[str(w.message)[:300] for w in given[:5]])
        print(json.dumps(record), file=out, flush=True)
    print(json.dumps({"event": "end"}), file=out, flush=True)  # a crash after this is in teardown


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        for key, case in build_cases().items():
            print(case.kind, key)
    else:
        run(sys.argv[1:])
