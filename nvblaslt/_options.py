"""The options objects of nvmath-python's matmul API, with its field names: ``MatmulOptions``,
``MatmulPlanPreferences``, ``MatmulEpilogPreferences``, ``MatmulQuantizationScales`` and
the ``qualifiers`` dtype. Each accepts a dict with the same keys, as nvmath-python does."""

from __future__ import annotations

import dataclasses
import logging
import operator
import re
from dataclasses import dataclass, field
from typing import Any

from ._errors import NvblasltTypeError, NvblasltValueError
from ._types import check_compute_type

DEFAULT_WORKSPACE = 32 << 20  # what cuBLASLt's docs suggest for Hopper
_SIZE = re.compile(r"^\s*(?P<number>(\d+\.?\d*|\.\d+)(e[+-]?\d+)?)\s*(?P<unit>(?P<power>[kmgt]?)(?P<binary>i?)b|%)\s*$",
                   re.IGNORECASE)


def _valid_size(text: str) -> bool:
    """A size with a unit ("8 GiB", "512 kB", "5e7 B") or a share from 0 to 100 % (as nvmath-python takes)."""
    match = _SIZE.match(text)
    return match is not None and (match["unit"] != "%" or 0 < float(match["number"]) <= 100)


def memory_limit_bytes(limit: int | float | str, total: int) -> int:
    """``options.memory_limit`` in bytes on a GPU of ``total`` bytes, read as nvmath-python reads
    it: an int is bytes, a float up to 1 a share of the GPU's memory, "80%" a share, "8 GB"
    decimal and "8 GiB" binary units."""
    if isinstance(limit, int):
        return limit
    if isinstance(limit, float):
        return int(limit * total) if limit <= 1 else int(limit)
    match = _SIZE.match(limit)
    assert match is not None  # MatmulOptions checked the form
    number = float(match["number"])
    if match["unit"] == "%":
        return int(number * total / 100)
    power = match["power"].lower()
    exponent = "kmgt".index(power) + 1 if power else 0
    return int(number * (1024 if match["binary"] else 1000) ** exponent)


@dataclass
class MatmulOptions:
    """How the multiplication is set up (nvmath-python's ``MatmulOptions`` fields).

    ``compute_type`` / ``scale_type``: a name (``"tf32"``, ``"COMPUTE_32F_FAST_TF32"``) or the
    cuBLAS enum value; ``result_type``: a dtype (name, NumPy/CuPy/PyTorch dtype) or a
    ``cudaDataType`` value; ``result_amax``: also return amax(|D|) (fp8 results);
    ``inplace``: write the result into ``c``; ``device_id``: the GPU for host (NumPy / CPU
    torch) operands; ``blocking``: ``True`` waits for the result, ``"auto"`` only for host
    operands; ``handle``: a ``cublasLtHandle_t`` to use; ``logger``: where decisions are
    logged; ``fast_accumulation``: cuBLASLt's fast fp8 accumulation (fewer promotions to fp32;
    fp8 operands only); ``memory_limit``: the most workspace an algorithm may use (bytes, a
    size such as "1 GiB", or a share of the GPU's memory such as "10%"; it lowers
    ``preferences.workspace_limit``, never raises it); ``sm_count_target``: SMs the kernels may
    assume. ``allocator`` is accepted as nvmath-python's is (nvblaslt allocates results from the
    operands' own framework); ``block_scaling`` only at its default (block-scaled fp8/fp4 is not
    exposed yet)."""

    compute_type: Any = None
    scale_type: Any = None
    result_type: Any = None
    result_amax: bool = False
    inplace: bool = False
    block_scaling: bool = False
    sm_count_target: int | None = 0
    fast_accumulation: bool | None = False
    device_id: int | None = 0
    handle: int | None = None
    logger: logging.Logger | None = None
    memory_limit: int | str | None = "80%"
    blocking: Any = "auto"
    allocator: Any = None

    def __post_init__(self):
        if self.compute_type is not None:  # as nvmath-python's ComputeType(value) does, here and not at first use
            check_compute_type(self.compute_type, "options.compute_type")
        if self.blocking is not True and not (isinstance(self.blocking, str) and self.blocking == "auto"):
            raise NvblasltValueError(f"options.blocking: The value specified for blocking must be either True or "
                                     f"'auto'. Got {self.blocking!r}")
        if self.device_id is None:
            self.device_id = 0
        if isinstance(self.device_id, bool) or not isinstance(self.device_id, int):
            raise NvblasltTypeError(f"options.device_id: expected a GPU ordinal (int ≥ 0), got {self.device_id!r}")
        # a negative ordinal is refused where the options are used, as nvmath-python does: see check_device_id
        for name in ("result_amax", "inplace", "block_scaling"):
            if not isinstance(getattr(self, name), bool):
                raise NvblasltTypeError(f"options.{name}: expected a bool, got {getattr(self, name)!r}")
        if self.block_scaling:
            raise NvblasltValueError("options.block_scaling: block-scaled (MXFP8/NVFP4) matmuls are not supported "
                                     "by nvblaslt yet")
        if self.sm_count_target is None:
            self.sm_count_target = 0
        if isinstance(self.sm_count_target, bool) or not isinstance(self.sm_count_target, int) \
                or self.sm_count_target < 0:
            raise NvblasltValueError(f"options.sm_count_target: expected an int ≥ 0, got {self.sm_count_target!r}")
        if self.handle is not None and (isinstance(self.handle, bool) or not isinstance(self.handle, int)):
            raise NvblasltTypeError(f"options.handle: expected a cublasLtHandle_t as an int, got {self.handle!r}")
        if self.memory_limit is None:
            self.memory_limit = "80%"
        limit = self.memory_limit
        if isinstance(limit, bool) or not isinstance(limit, (int, float, str)) or (
                isinstance(limit, str) and not _valid_size(limit)) or (
                not isinstance(limit, str) and not 0 <= limit < float("inf")):
            raise NvblasltValueError(f"options.memory_limit: expected bytes (a number ≥ 0, or a share of the GPU's "
                                     f"memory up to 1.0), a size such as '8 GiB', or a share such as '80%', got "
                                     f"{limit!r}")
        if not isinstance(self.fast_accumulation, (bool, type(None))):
            raise NvblasltTypeError(f"options.fast_accumulation: expected a bool, got {self.fast_accumulation!r}")
        if self.allocator is not None and not any(callable(getattr(self.allocator, method, None))
                                                  for method in ("memalloc_async", "memalloc")):
            raise NvblasltTypeError(f"options.allocator: expected a memory manager with memalloc_async(size, stream) "
                                    f"or memalloc(size) (nvmath-python's BaseCUDAMemoryManagerAsync / "
                                    f"BaseCUDAMemoryManager), got {type(self.allocator).__name__}")
        if self.logger is not None and not isinstance(self.logger, logging.Logger):
            raise NvblasltTypeError(f"options.logger: expected a logging.Logger, got {type(self.logger).__name__}")


@dataclass
class MatmulEpilogPreferences:
    """Epilog preferences: ``aux_type`` (an fp8 type for the GELU aux output) and ``aux_amax``."""

    aux_type: Any = None
    aux_amax: bool = False


@dataclass
class MatmulPlanPreferences:
    """What the heuristics may return. ``limit``: how many algorithms to ask for (autotune times
    them); ``workspace_limit``: bytes of workspace an algorithm may use (an nvblaslt addition)."""

    reduction_scheme_mask: int | None = None
    max_waves_count: float | None = 0.0
    numerical_impl_mask: int | None = None
    limit: int = 8
    epilog: MatmulEpilogPreferences | dict | None = None
    workspace_limit: int = DEFAULT_WORKSPACE

    def __post_init__(self):
        if self.max_waves_count is None:
            self.max_waves_count = 0.0
        # 0 is passed on, as nvmath-python passes it: cuBLASLt's heuristics refuse it (INVALID_VALUE)
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or not 0 <= self.limit <= 1024:
            raise NvblasltValueError(f"preferences.limit: expected an int from 0 to 1024 (0 goes to cuBLASLt, which "
                                     f"refuses it), got {self.limit!r}")
        if isinstance(self.workspace_limit, bool) or not isinstance(self.workspace_limit, int) \
                or not 0 <= self.workspace_limit < 1 << 40:
            raise NvblasltValueError(f"preferences.workspace_limit: expected bytes (an int ≥ 0), got "
                                     f"{self.workspace_limit!r}")
        if isinstance(self.max_waves_count, bool) or not isinstance(self.max_waves_count, (int, float)) \
                or not 0 <= self.max_waves_count < 1e9:
            raise NvblasltValueError(f"preferences.max_waves_count: expected a number ≥ 0, got "
                                     f"{self.max_waves_count!r}")
        for name in ("reduction_scheme_mask", "numerical_impl_mask"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value < 1 << 64):
                raise NvblasltValueError(f"preferences.{name}: expected a bit mask (int ≥ 0), got {value!r}")
        self.epilog = as_options(MatmulEpilogPreferences, self.epilog, "preferences.epilog")


@dataclass
class MatmulQuantizationScales:
    """fp8 scales for A, B, C and D: Python numbers, NumPy scalars or float32 device arrays of
    shape () or (1,) (read by the GPU at execution, so they may change between executions)."""

    a: Any = None
    b: Any = None
    c: Any = None
    d: Any = None


def _qualifiers_dtype():
    import numpy as np

    return np.dtype([("structure", object), ("is_conjugate", "<i4")])


class _LazyQualifiersDtype:
    """``matrix_qualifiers_dtype`` without importing NumPy at ``import nvblaslt``."""

    _dtype = None

    def get(self):
        if self._dtype is None:
            self._dtype = _qualifiers_dtype()
        return self._dtype


qualifiers_dtype = _LazyQualifiersDtype()


def as_options(cls, value, argument: str):
    """``cls`` from None, an instance, or a dict of its fields (nvmath-python accepts either)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return dataclasses.replace(value)
    if type(value).__name__ == cls.__name__ and dataclasses.is_dataclass(value) and not isinstance(value, type):
        # nvmath-python's own class of the same name
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dataclasses.asdict(value).items() if k in known})
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise NvblasltValueError(f"{argument}: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**value)
    raise NvblasltTypeError(f"{argument}: expected a dict or {cls.__name__}, got {type(value).__name__}")


def with_shortcuts(options, compute_type=None, result_type=None) -> MatmulOptions:
    """``options`` (None, a dict or a ``MatmulOptions``) as a new ``MatmulOptions`` with the
    ``compute_type=`` / ``result_type=`` keywords of ``matmul`` and ``Matmul`` applied. A keyword
    also set in ``options`` is refused: which of the two should win would be a guess."""
    found = as_options(MatmulOptions, options, "options")
    changes = {}
    for name, value in (("compute_type", compute_type), ("result_type", result_type)):
        if value is None:
            continue
        if getattr(found, name) is not None:
            raise NvblasltValueError(f"{name}: given both as a keyword ({value!r}) and in options.{name} "
                                     f"({getattr(found, name)!r}); give it once")
        if name == "compute_type":
            check_compute_type(value, name)
        changes[name] = value
    return dataclasses.replace(found, **changes) if changes else found


def conjugate_flags(qualifiers) -> tuple[bool, bool]:
    """(conjugate A, conjugate B) from nvmath-python's qualifiers: a length-3 array of
    ``matrix_qualifiers_dtype`` (or a sequence of dicts with ``is_conjugate``)."""
    if qualifiers is None:
        return False, False
    if getattr(qualifiers, "ndim", 1) != 1:
        raise NvblasltValueError(f"qualifiers: expected a 1-D array of 3 matrix qualifiers, got "
                                 f"{getattr(qualifiers, 'ndim')} dimensions")
    try:
        entries = [qualifiers[i] for i in range(len(qualifiers))]
    except (TypeError, KeyError, IndexError):  # a mapping or a sequence not indexed 0, 1, 2
        raise NvblasltTypeError(f"qualifiers: expected an array of 3 matrix qualifiers (A, B, C), got "
                                f"{type(qualifiers).__name__}") from None
    if len(entries) != 3:
        raise NvblasltValueError(f"qualifiers: expected 3 entries (A, B, C), got {len(entries)}")
    flags = []
    for name, entry in zip("abc", entries):
        try:
            flag = entry["is_conjugate"]
        except (KeyError, IndexError, TypeError, ValueError):
            raise NvblasltTypeError(f"qualifiers[{name!r}]: expected a record with 'is_conjugate', got "
                                    f"{entry!r}") from None
        try:
            value = operator.index(flag)  # bools, ints, NumPy integers (the dtype's field is an int32)
        except TypeError:
            value = None
        if value not in (0, 1):
            raise NvblasltValueError(f"qualifiers[{name!r}]['is_conjugate']: expected the integer 0 or 1 (or a bool), got "
                                     f"{flag!r}")
        flags.append(bool(value))
    if flags[2]:
        raise NvblasltValueError("qualifiers: conjugating C is not supported (cuBLASLt has no conjugate C)")
    return flags[0], flags[1]


__all__ = ["MatmulOptions", "MatmulPlanPreferences", "MatmulEpilogPreferences", "MatmulQuantizationScales",
           "as_options", "conjugate_flags", "qualifiers_dtype", "with_shortcuts", "field"]
