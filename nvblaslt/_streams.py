"""Streams as plain integer handles, whatever object the caller holds."""

from __future__ import annotations

from ._errors import NvblasltTypeError, NvblasltValueError


def stream_handle(stream) -> int:
    """The ``cudaStream_t`` of ``stream``: an int, anything with ``__cuda_stream__`` (cuda.core),
    a CuPy or PyTorch stream, or a cuda.bindings stream object. 0, 1 and 2 are CUDA's legacy,
    legacy (explicit) and per-thread default streams."""
    try:
        handle = _raw_handle(stream)
    except NvblasltTypeError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the object raised, say it in our words
        raise NvblasltTypeError(f"stream: could not read a stream handle from {type(stream).__name__}: "
                                f"{type(exc).__name__}: {exc}") from exc
    if isinstance(handle, bool) or not isinstance(handle, int) or not 0 <= handle < 1 << 64:
        raise NvblasltValueError(f"stream: expected a cudaStream_t (an int from 0 to 2**64 - 1), got {handle!r}")
    return handle


def _raw_handle(stream):
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        version_and_handle = protocol() if callable(protocol) else protocol
        if not isinstance(version_and_handle, tuple) or len(version_and_handle) != 2:
            raise NvblasltTypeError(f"stream: __cuda_stream__ must give (version, handle), got {version_and_handle!r}")
        return int(version_and_handle[1])
    for attribute in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int):
            return handle
    getptr = getattr(stream, "getPtr", None)  # cuda.bindings CUstream / cudaStream_t
    if getptr is not None:
        return int(getptr())
    raise NvblasltTypeError(
        f"stream: expected an int handle, an object with __cuda_stream__, or a CuPy/PyTorch/cuda.bindings "
        f"stream, got {type(stream).__name__}"
    )


def dlpack_stream(handle: int) -> int:
    """The DLPack ``stream=`` value for a handle: 1 names the legacy default stream, 0 is not allowed."""
    return handle or 1
