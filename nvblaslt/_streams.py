"""Streams as plain integer handles, whatever object the caller holds."""

from __future__ import annotations

import sys

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


def current_stream_getter(kind: str, device: int | None):
    """A no-argument function giving the stream the caller's framework works on now (0: none)."""
    if kind == "cupy":
        cuda = sys.modules["cupy"].cuda
        return lambda: cuda.get_current_stream().ptr
    if kind == "torch":
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # skips building a Stream object
        if device is None:
            device = torch.cuda.current_device()
        if raw is not None:
            return lambda: raw(device)
        return lambda: torch.cuda.current_stream(device).cuda_stream
    return lambda: 0


def framework_stream_of(kind: str, array) -> int:
    """The current stream of ``array``'s framework on ``array``'s device: the function form's default."""
    getter = _stream_of.get(kind)
    if getter is None:
        getter = _stream_of[kind] = _stream_of_array(kind)
    return getter(array)


_stream_of: dict = {}  # kind -> array -> stream, built once per kind (the hot path looks up nothing else)


def _stream_of_array(kind: str):
    if kind == "torch":
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return lambda array: raw(array.get_device())
        return lambda array: torch.cuda.current_stream(array.device).cuda_stream
    if kind == "cupy":
        get_current_stream = sys.modules["cupy"].cuda.get_current_stream
        return lambda array: get_current_stream().ptr
    return lambda array: 0


def stream_on_device(kind: str):
    """``current(device) -> int``: the framework's current stream on a device (the function form's
    fast path, which has read the device already)."""
    if kind == "torch":
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw
        return lambda device: torch.cuda.current_stream(device).cuda_stream
    if kind == "cupy":
        get_current_stream = sys.modules["cupy"].cuda.get_current_stream
        return lambda device: get_current_stream().ptr  # CuPy's current stream is that of the current device
    return lambda device: 0


def current_stream(kind: str, device: int | None) -> int:
    """The stream the caller's framework is working on now (legacy default stream: 0)."""
    return current_stream_getter(kind, device)()


def dlpack_stream(handle: int) -> int:
    """The DLPack ``stream=`` value for a handle: 1 names the legacy default stream, 0 is not allowed."""
    return handle or 1
