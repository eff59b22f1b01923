"""``ragged_dot``: ``jax.lax.ragged_dot`` on cuBLASLt's grouped GEMM (``nvblaslt.grouped_matmul``).

lhs (m, k) split into groups of rows by ``group_sizes``, rhs (g, k, n): out[rows of group i] =
lhs[rows] @ rhs[i]; rows past the groups' total are zero. Its gradient is two more grouped GEMMs:
dlhs = dout @ rhsᵀ per group (the same form, rhs read transposed), drhs = the 2-D × 2-D form split
along K, lhsᵀ @ dout (empty groups give zeros). Transposed operands are strided views of XLA's
buffers (``DeviceArray`` over a borrowed pointer): no copy. Offsets stay on the GPU.
"""

from __future__ import annotations

from functools import partial
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from .. import DeviceArray, _cuda, _grouped_version
from .._memory import DeviceBuffer
from .._errors import NvblasltTypeError, NvblasltValueError
from .._loader import library
from .._strides import c_strides
from . import _tuning
from ._bridge import device_of, vary_alike
from ._planning import dtype_of

class _Borrowed:
    """XLA's memory, lent for one call: a ``DeviceArray`` over it frees nothing."""

    __slots__ = ("pointer",)

    def __init__(self, pointer: int):
        self.pointer = pointer

    def used_on(self, stream: int) -> None:
        pass

    def release(self) -> None:
        pass


def _view(buffer, transposed: bool, stream: int, device: int):
    interface = buffer.__cuda_array_interface__
    shape = tuple(buffer.shape)
    strides = c_strides(shape)
    if transposed:
        shape = (*shape[:-2], shape[-1], shape[-2])
        strides = (*strides[:-2], strides[-1], strides[-2])
    return DeviceArray(cast(DeviceBuffer, _Borrowed(interface["data"][0])), shape, strides,
                       dtype_of(buffer.dtype, "buffer"), device, stream)


def _grouped_call(transposes: tuple, out_dtype: str, ctx, out, a, b, offs) -> None:
    from .. import grouped_matmul  # grouped GEMM's modules load on first use

    stream = int(ctx.stream)
    device = device_of(stream, out.__cuda_array_interface__["data"][0])  # the GPU XLA runs this call on
    _tuning.count_entry(device)
    with _cuda.on_device(device):  # a no-op with one GPU, or where XLA made that GPU current
        grouped_matmul(_view(a, transposes[0], stream, device), _view(b, transposes[1], stream, device),
                       _view(offs, False, stream, device), out_dtype=out_dtype, out=_view(out, False, stream, device),
                       stream=stream)


def _grouped(a, b, offs, shape, out_dtype, transposes=(False, False)):
    if jax.default_backend() != "gpu":
        raise NvblasltValueError(f"lhs, rhs: JAX's backend is {jax.default_backend()}, but nvblaslt.jax.ragged_dot "
                                 f"runs cuBLASLt on CUDA GPUs only")
    result = jax.ShapeDtypeStruct(shape, jnp.dtype(out_dtype))
    out = buffer_callback(partial(_grouped_call, transposes, out_dtype), result)(a, b, offs)
    return vary_alike((out, a, b, offs))[0]  # under shard_map, a per-shard result (buffer_callback types it as shared)


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
    """``jax.lax.ragged_dot`` on cuBLASLt's grouped GEMM: out[rows of group i] = lhs[rows] @ rhs[i].

    Parameters
    ----------
    lhs : jax.Array
        (m, k), bfloat16 or float16, its rows sorted by group.
    rhs : jax.Array
        (g, k, n), the same dtype.
    group_sizes : jax.Array
        (g,) integers: how many rows of lhs each group takes, in order (empty groups and sizes of any
        multiple are fine). Rows past their total give zeros.
    precision : None
        Accepted for ``jax.lax.ragged_dot``'s signature; cuBLASLt's grouped kernels accumulate in float32.
    preferred_element_type : dtype, optional
        The result's dtype: lhs's (default) or float32.
    group_offset : None
        Not supported (refused by name).

    Returns
    -------
    jax.Array
        (m, n). ``jax.grad`` gives lhs's and rhs's gradients with two more grouped GEMMs.

    Raises
    ------
    NvblasltUnsupportedError
        The loaded cuBLASLt is older than 13.4 (the message names it and how to load a newer one).
    NvblasltValueError
        Shapes that do not fit the form, ``group_offset``, arrays off a GPU.
    NvblasltTypeError
        Dtypes the grouped GEMM does not take.

    Examples
    --------
    On a GPU with cuBLASLt 13.4 or newer:

    .. code-block:: python

        tokens = jnp.ones((8192, 4096), jnp.bfloat16)              # sorted by expert
        experts = jnp.ones((8, 4096, 14336), jnp.bfloat16)
        sizes = jnp.array([900, 1200, 0, 1900, 1200, 800, 1300, 892], jnp.int32)
        hidden = jax.jit(nvblaslt.jax.ragged_dot)(tokens, experts, sizes)   # (8192, 14336)
    """
    if group_offset is not None:
        raise NvblasltValueError("group_offset: not supported by nvblaslt.jax.ragged_dot; got a value")
    _grouped_version.require_grouped(library())
    if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.ndim != 1:
        raise NvblasltValueError(f"lhs, rhs, group_sizes: expected (m, k), (g, k, n) and (g,), got {lhs.shape}, "
                                 f"{rhs.shape} and {group_sizes.shape}")
    if lhs.shape[1] != rhs.shape[1] or rhs.shape[0] != group_sizes.shape[0]:
        raise NvblasltValueError(f"lhs, rhs, group_sizes: k and g must agree, got {lhs.shape}, {rhs.shape} and "
                                 f"{group_sizes.shape}")
    for name, x in (("lhs", lhs), ("rhs", rhs)):
        if dtype_of(x.dtype, name).name not in ("bfloat16", "float16") or x.dtype != lhs.dtype:
            raise NvblasltTypeError(f"{name}: expected bfloat16 or float16 (both the same), got {x.dtype}")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise NvblasltTypeError(f"group_sizes: expected integers, got {group_sizes.dtype}")
    out_dtype = jnp.dtype(preferred_element_type or lhs.dtype).name
    if out_dtype not in (lhs.dtype.name, "float32"):
        raise NvblasltTypeError(f"preferred_element_type: expected {lhs.dtype.name} or float32, got {out_dtype}")
    return _ragged(out_dtype, *vary_alike((lhs, rhs, group_sizes)))  # under shard_map, typed alike


def _offsets_and_mask(group_sizes, m: int):
    offs = jnp.cumsum(group_sizes.astype(jnp.int32)).astype(jnp.int32)
    return offs, (jnp.arange(m) < offs[-1])[:, None]


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ragged(out_dtype, lhs, rhs, group_sizes):
    offs, inside = _offsets_and_mask(group_sizes, lhs.shape[0])
    out = _grouped(lhs, rhs, offs, (lhs.shape[0], rhs.shape[2]), out_dtype)
    return jnp.where(inside, out, jnp.zeros_like(out))


def _ragged_fwd(out_dtype, lhs, rhs, group_sizes):
    return _ragged(out_dtype, lhs, rhs, group_sizes), (lhs, rhs, group_sizes)


def _ragged_bwd(out_dtype, residuals, dout):
    lhs, rhs, group_sizes = residuals
    offs, inside = _offsets_and_mask(group_sizes, lhs.shape[0])
    dout = jnp.where(inside, dout, jnp.zeros_like(dout)).astype(lhs.dtype)
    dlhs = _grouped(dout, rhs, offs, lhs.shape, lhs.dtype.name, transposes=(False, True))
    dlhs = jnp.where(inside, dlhs, jnp.zeros_like(dlhs))
    drhs = _grouped(lhs, dout, offs, rhs.shape, rhs.dtype.name, transposes=(True, False))
    return dlhs, drhs, np.zeros(group_sizes.shape, jax.dtypes.float0)


_ragged.defvjp(_ragged_fwd, _ragged_bwd)
