"""Arrays of nvblaslt's own with random values, for ``nvblaslt tune``: its problems are planned and timed on
them (timings on zeros read fast: less power). Every array of one dtype starts with the same values, so the
first rows of two arrays of a shape's prefix hold the same data (``_invariant_tune`` compares rows across M)."""

from __future__ import annotations

import ctypes

from . import _cuda, _dtypes, _memory
from ._cuda import cudart

_FILL_ELEMENTS = 1 << 22  # random values made once per dtype, copied over each array


def pattern(dtype: _dtypes.DType, seed: int = 0) -> bytes:
    """``_FILL_ELEMENTS`` random values of ``dtype`` as bytes (timings on zeros read fast: less power)."""
    try:
        import numpy
    except ImportError:
        return _pattern_without_numpy(dtype, seed)
    generator = numpy.random.default_rng(seed)
    if dtype.itemsize == 1:
        mask = 0xB7 if dtype.name == "float8_e4m3fn" else 0xBB if dtype.name == "float8_e5m2" else 0xFF
        return (generator.integers(0, 256, _FILL_ELEMENTS, dtype=numpy.uint8) & mask).tobytes()
    values = generator.uniform(-1, 1, _FILL_ELEMENTS).astype(numpy.float32)
    if dtype.name == "bfloat16":
        return (values.view(numpy.uint32) >> 16).astype(numpy.uint16).tobytes()
    return values.astype({2: numpy.float16, 4: numpy.float32, 8: numpy.float64}[dtype.itemsize]).tobytes()


def _pattern_without_numpy(dtype: _dtypes.DType, seed: int) -> bytes:
    import random

    generator = random.Random(seed)
    if dtype.itemsize == 1:  # fp8 (sign, a small exponent: no NaN or infinity), int8, a ReLU bitmask
        mask = 0xB7 if dtype.name == "float8_e4m3fn" else 0xBB if dtype.name == "float8_e5m2" else 0xFF
        return bytes(generator.getrandbits(8) & mask for _ in range(_FILL_ELEMENTS))
    import array
    import struct

    values = array.array("f", (generator.uniform(-1, 1) for _ in range(_FILL_ELEMENTS)))
    if dtype.itemsize >= 4:
        return values.tobytes() if dtype.itemsize == 4 else array.array("d", values).tobytes()
    if dtype.name == "bfloat16":
        return array.array("H", (struct.unpack("I", struct.pack("f", v))[0] >> 16 for v in values)).tobytes()
    return b"".join(struct.pack("e", v) for v in values)  # float16


def device_array(spec: dict, device: int, stream: int, patterns: dict, seed: int = 0) -> _memory.DeviceArray:
    """An array laid out as ``spec`` says, filled with ``pattern(dtype, seed)`` (made once per dtype and seed, kept
    in ``patterns``)."""
    from ._strides import span_elements

    dtype = _dtypes.BY_NAME[spec["dtype"]]
    shape, strides = tuple(spec["shape"]), tuple(spec["strides"])
    size = span_elements(shape, strides) * dtype.itemsize
    buffer = _memory.DeviceBuffer(size, stream)
    which = dtype.name if seed == 0 else f"{dtype.name} seed {seed}"
    values = patterns.get(which)
    if values is None:
        values = patterns[which] = pattern(dtype, seed)
    host = ctypes.create_string_buffer(values, len(values))
    for offset in range(0, size, len(values)):
        _cuda.check(cudart.cudaMemcpyAsync(buffer.pointer + offset, ctypes.addressof(host),
                                           min(len(values), size - offset),
                                           cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync")
    _cuda.check(cudart.cudaStreamSynchronize(stream), "cudaStreamSynchronize")  # host is freed on return
    return _memory.DeviceArray(buffer, shape, strides, dtype, device, stream)
