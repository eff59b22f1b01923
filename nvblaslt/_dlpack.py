"""DLPack in ctypes: read a producer's capsule, and export our own buffers.

Reading leaves the capsule unconsumed, so its producer's destructor releases it; the
producer object itself keeps the memory alive for as long as nvblaslt holds it.
"""

from __future__ import annotations

import ctypes

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
FLAG_READ_ONLY = 1 << 0
MAX_NDIM = 64


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# Private prototypes: setting argtypes on ctypes.pythonapi's shared function objects would change them
# for every other library in the process (and theirs would change ours).
_api = ctypes.pythonapi
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR)(
    ("PyCapsule_New", _api))


def read_capsule(capsule) -> tuple[DLTensor, bool, tuple[int, int] | None]:
    """(the DLTensor, read-only flag, (major, minor) or None for an unversioned capsule)."""
    if type(capsule).__name__ != "PyCapsule":
        raise ValueError(f"__dlpack__ returned a {type(capsule).__name__}, not a DLPack capsule")
    if _is_valid(capsule, b"dltensor_versioned"):
        managed = DLManagedTensorVersioned.from_address(_get_pointer(capsule, b"dltensor_versioned"))
        version = (managed.version.major, managed.version.minor)
        return managed.dl_tensor, bool(managed.flags & FLAG_READ_ONLY), version
    if _is_valid(capsule, b"dltensor"):
        return DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor")).dl_tensor, False, None
    raise ValueError("not a DLPack capsule (expected a 'dltensor' or 'dltensor_versioned' PyCapsule)")


def tensor_shape(tensor: DLTensor) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """(shape, strides in elements or None for compact row-major)."""
    ndim = tensor.ndim
    if not 0 <= ndim <= MAX_NDIM:  # never read a shape array past what any real tensor has
        raise ValueError(f"DLPack tensor claims {ndim} dimensions (expected 0 to {MAX_NDIM})")
    if ndim and not tensor.shape:
        raise ValueError("DLPack tensor has dimensions but a NULL shape array")
    shape = tuple((ctypes.c_int64 * ndim).from_address(tensor.shape)) if ndim else ()
    strides = tuple((ctypes.c_int64 * ndim).from_address(tensor.strides)) if tensor.strides and ndim else None
    return shape, strides


# ---- export ---------------------------------------------------------------------------------
# Exports alive in consumers, keyed by the DLManagedTensor's address; the deleter drops them.
_exports: dict[int, tuple] = {}


def _release(address: int) -> None:
    _exports.pop(address, None)


_deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_release)


@_DESTRUCTOR
def _capsule_destructor(capsule: int) -> None:
    # An unconsumed capsule (never renamed by a consumer) still owns its tensor.
    if _raw_is_valid(capsule, b"dltensor"):
        _release(_raw_get_pointer(capsule, b"dltensor"))


def export(pointer: int, shape: tuple[int, ...], strides: tuple[int, ...], dlpack_type: tuple[int, int],
           device: int, owner: object):
    """A ``dltensor`` capsule over device memory that ``owner`` keeps alive until the consumer is done."""
    ndim = len(shape)
    shape_array = (ctypes.c_int64 * ndim)(*shape)
    strides_array = (ctypes.c_int64 * ndim)(*strides)
    managed = DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = pointer
    tensor.device = DLDevice(KDL_CUDA, device)
    tensor.ndim = ndim
    tensor.dtype = DLDataType(dlpack_type[0], dlpack_type[1], 1)
    tensor.shape = ctypes.addressof(shape_array)
    tensor.strides = ctypes.addressof(strides_array)
    managed.deleter = ctypes.cast(_deleter, ctypes.c_void_p)
    address = ctypes.addressof(managed)
    _exports[address] = (managed, shape_array, strides_array, owner)
    return _capsule_new(address, b"dltensor", _capsule_destructor)
