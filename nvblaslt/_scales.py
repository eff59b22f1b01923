"""The numbers cuBLASLt reads through pointers: alpha and beta in the plan's scale type (``Scalar``)
and the fp8 quantization scales (``Scales``), whose numbers live in a small device buffer of the
plan's own, written stream-ordered; float32 GPU arrays given as scales are read where they are.
"""

from __future__ import annotations

import ctypes
import math
import struct

from . import _cuda, _dtypes, _memory, _operands
from ._cuda import cudart
from ._errors import NvblasltArgumentError, NvblasltTypeError, NvblasltValueError
from ._frameworks import refuse_masked
from ._options import MatmulQuantizationScales

_SCALAR_FORMATS = {"CUDA_R_16F": "<e", "CUDA_R_32F": "<f", "CUDA_R_64F": "<d", "CUDA_C_32F": "<ff",
                   "CUDA_C_64F": "<dd"}
_SCALE_SLOT = 256  # cuBLASLt wants each scale pointer on its own aligned slot
_SCALE_KEYS = ("a", "b", "c", "d", "aux")  # slots of the plan's scale buffer; "aux": the fp8 epilog aux


class Scalar:
    """alpha or beta in the plan's scale type, in memory cuBLASLt reads through a pointer."""

    def __init__(self, scale_type: str, argument: str):
        self._format = _SCALAR_FORMATS[scale_type]
        self._complex = len(self._format) == 3
        self._argument = argument
        self.buffer = ctypes.create_string_buffer(16)
        self.reference = ctypes.byref(self.buffer)
        self.value = None

    def set(self, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float, complex)):
            value = host_number(value, self._argument)
        if not self._complex and isinstance(value, complex):
            raise NvblasltTypeError(f"{self._argument}: a complex value {value!r} needs complex operands")
        try:
            if self._complex:
                value = complex(value)
                struct.pack_into(self._format, self.buffer, 0, value.real, value.imag)
            else:
                value = float(value)  # (complex refused above) also runs a float subclass's own conversion, which may refuse
                struct.pack_into(self._format, self.buffer, 0, value)
        except (ArithmeticError, struct.error):
            raise NvblasltValueError(f"{self._argument}: {value!r} does not fit the plan's scale type "
                                     f"({self._format[1:]} per component)") from None
        except Exception as exc:  # noqa: BLE001 - a number type whose conversion raises
            raise NvblasltTypeError(f"{self._argument}: {type(value).__name__} could not be converted to a number: "
                                    f"{exc}") from exc
        self.value = value


def host_number(value, argument: str) -> int | float | complex:
    """A Python number from a NumPy scalar or a one-element array (0-d or of one element), as
    nvmath-python reads alpha and beta into a host array. A GPU array's value is copied back, which
    waits for it (nvmath-python reads a CUDA torch scalar so too): pass a number where that matters."""
    refuse_masked(value, argument)
    shape = getattr(value, "shape", None)
    if hasattr(value, "item") and isinstance(shape, tuple):  # NumPy scalars and arrays, torch/CuPy/JAX arrays
        if math.prod(shape) != 1:
            raise NvblasltValueError(f"{argument}: expected a number or a one-element array, got a "
                                     f"{type(value).__name__} of shape {tuple(shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float, complex)):
        raise NvblasltTypeError(f"{argument}: expected a number, got {type(value).__name__} {value!r}")
    return value


def _scale_value(value, name: str):
    """A fp8 scale: a number (returned as float) or a float32 device array of one element (returned)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise NvblasltTypeError(f"{name}: expected a number or a float32 array, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            number = float("inf")
        if not abs(number) <= 3.4028234663852886e38:  # a float32 (NaN is refused too)
            raise NvblasltValueError(f"{name}: {value!r} is not a finite float32 value")
        return number
    refuse_masked(value, name)
    if hasattr(value, "__array_interface__") and not hasattr(value, "__cuda_array_interface__") \
            and getattr(value, "size", 0) == 1:
        return float(value.reshape(()) if hasattr(value, "reshape") else value)  # NumPy scalars and 1-element arrays
    if hasattr(value, "__float__") and not hasattr(value, "__len__") and not hasattr(value, "__dlpack__"):
        return float(value)
    return value


class Scales:
    """One plan's fp8 scales by key ("a", "b", "c", "d", "aux"): a float for a number (kept in
    ``buffer``), an ``Operand`` for a float32 GPU array. The plan owns ``buffer``'s lifetime, as it
    owns its workspace's: it orders it after its streams and releases it."""

    def __init__(self, types, device: int, host: bool = False, has_c: bool = False):
        self._types = types
        fp8 = {"a": types.a, "b": types.b, "c": types.c if has_c else None, "d": types.d}
        # the operands whose values are scaled: fp8 ones, each of which must have its scale
        self.required = tuple(key for key, dtype in fp8.items() if dtype in _dtypes.FLOAT8)
        self._device = device
        self._host = host  # host operands: a scale may be a one-element host array, read as a number
        self._values: dict = {}
        self.buffer: _memory.DeviceBuffer | None = None  # made by the first write of a number

    def check(self, scales, stream: int, *, on_reset: bool = False) -> dict:
        """``quantization_scales`` as given to the plan (or, ``on_reset``, to ``reset_operands``, where any
        subset of the keys may change): checked values by key. As in nvmath-python, every fp8 operand
        and an fp8 result must have a scale, and only those may have one."""
        required = self.required
        if scales is None:
            if required and not on_reset:
                raise NvblasltValueError(f"quantization_scales: Scales are required for narrow-precision (FP8 and "
                                         f"lower) operations: give scales for {', '.join(map(repr, required))} "
                                         f"(1.0 for none)")
            return {}
        if not required:
            raise NvblasltValueError("quantization_scales: only fp8 operands or results take scales")
        if isinstance(scales, MatmulQuantizationScales) or (type(scales).__name__ == "MatmulQuantizationScales"):
            scales = {k: getattr(scales, k) for k in "abcd"}
        if not isinstance(scales, dict):
            raise NvblasltArgumentError(f"quantization_scales: Scale factors must be provided as an object of type "
                                        f"MatmulQuantizationScales or as a dict with keys among 'a', 'b', 'c', 'd'; "
                                        f"got {type(scales).__name__} {scales!r}")
        unknown = set(scales) - set("abcd")
        if unknown:
            raise NvblasltValueError(f"quantization_scales: expected keys among 'a', 'b', 'c', 'd', got "
                                     f"{sorted(map(str, unknown))}")
        for key, value in scales.items():
            if value is not None and key not in required:
                dtype = self._types.d if key == "d" else getattr(self._types, key)
                raise NvblasltValueError(f"quantization_scales['{key}']: Quantization scaling is not supported for "
                                         f"{key} when it is not a narrow-precision (FP8 and lower) type; it is "
                                         f"{dtype.name}")
        missing = [key for key in required if scales.get(key) is None]
        if missing and not on_reset:
            raise NvblasltValueError(f"quantization_scales: Scales are required for narrow-precision (FP8 and lower) "
                                     f"operations, for every fp8 operand and an fp8 result; missing {missing}")
        return self.check_values(scales, stream)

    def check_aux(self, value, stream: int) -> dict:
        """A new ``aux_quantization_scale`` for a plan whose fp8 aux took one at plan time."""
        if self._values.get("aux") is None:
            raise NvblasltValueError("epilog_inputs['aux_quantization_scale']: the plan has no fp8 epilog aux to scale "
                                     "(an fp8 aux_type and its scale are given to plan())")
        return self.check_values({"aux": value}, stream, "epilog_inputs['aux_quantization_scale']")

    def check_values(self, scales: dict, stream: int, argument: str = "quantization_scales['{}']") -> dict:
        """Each value a float or a float32 GPU array of one element on the plan's device; None is dropped."""
        checked = {}
        for key, value in scales.items():
            name = argument.format(key)
            value = _scale_value(value, name)
            if value is None:
                continue
            if not isinstance(value, float):
                op = _operands.read(value, name, stream)
                if op.host and self._host and op.dtype == _dtypes.FLOAT32 and op.shape in ((), (1,)):
                    checked[key] = _scale_value(ctypes.c_float.from_address(op.ptr).value, name)  # a number, as staged
                    continue
                if op.host or op.dtype != _dtypes.FLOAT32 or op.shape not in ((), (1,)) or op.device != self._device:
                    raise NvblasltValueError(f"{name}: expected a number or a float32 GPU array of shape () or (1,) on "
                                             f"GPU {self._device}, got {op.describe()}")
                if op.alignment < 4:
                    raise NvblasltValueError(f"{name}: pointer 0x{op.ptr:x} is not 4-byte aligned")
                value = op
            checked[key] = value
        return checked

    def write(self, values: dict, stream: int) -> None:
        """Take checked ``values`` (replacing those of the same keys) and write every number to the
        buffer on ``stream``; waits, so the host values may go."""
        self._values.update(values)
        if self.buffer is None:
            self.buffer = _memory.DeviceBuffer(len(_SCALE_KEYS) * _SCALE_SLOT, stream)
        for slot, key in enumerate(_SCALE_KEYS):
            value = self._values.get(key)
            if isinstance(value, float):
                _cuda.check(cudart.cudaMemcpyAsync(self.buffer.pointer + slot * _SCALE_SLOT, struct.pack("<f", value),
                                                   4, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream),
                            "cudaMemcpyAsync")
        _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def value(self, key: str):
        """The checked value held for ``key`` (a float or an Operand), or None."""
        return self._values.get(key)

    def stage(self, values: dict, stream: int) -> None:
        """Take checked ``values`` without writing them: their pointers are known (the buffer is made
        on first use), and ``write`` puts them in place when the plan that reads them commits."""
        self._values.update(values)
        if self.buffer is None:
            self.buffer = _memory.DeviceBuffer(len(_SCALE_KEYS) * _SCALE_SLOT, stream)

    def unstage(self, key: str, value) -> None:
        """Put back ``key``'s earlier ``value`` (None: it had none) after a plan that staged another failed."""
        if value is None:
            self._values.pop(key, None)
        else:
            self._values[key] = value

    def forget_arrays(self) -> None:
        """Drop the references to the caller's scale arrays; their pointers stay in use."""
        for value in self._values.values():
            if not isinstance(value, float):
                value.obj = None

    def pointer(self, key: str) -> int | None:
        """The device pointer cuBLASLt reads ``key``'s scale from; None when it has none."""
        value = self._values.get(key)
        if value is None:
            return None
        if isinstance(value, float):
            assert self.buffer is not None  # numbers live in the plan's scale buffer
            return self.buffer.pointer + _SCALE_KEYS.index(key) * _SCALE_SLOT
        return value.ptr

    def descriptor_pointers(self, problem) -> dict[str, int]:
        """The A/B/C/D scale pointer attributes of the problem's MatmulDesc, for the keys that have a scale."""
        # cuBLASLt's A is the caller's B when the problem is transposed: so are the scales
        keys = {"A": problem.a.source, "B": problem.b.source, "C": "c", "D": "d"}
        pointers = {f"{cuda_key}_SCALE_POINTER": self.pointer(key) for cuda_key, key in keys.items()}
        return {attribute: pointer for attribute, pointer in pointers.items() if pointer is not None}
