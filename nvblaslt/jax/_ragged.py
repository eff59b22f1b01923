"""``ragged_dot``: ``jax.lax.ragged_dot`` on cuBLASLt's grouped GEMM (``nvblaslt.GroupedMatmul``).

lhs (m, k) split into groups of rows by ``group_sizes``, rhs (g, k, n): out[rows of group i] =
lhs[rows] @ rhs[i]; rows past the groups' total are zero. Its gradient is two more grouped GEMMs:
dlhs = dout @ rhsᵀ per group (the same form, rhs read transposed), drhs = the 2-D × 2-D form split
along K, lhsᵀ @ dout (empty groups give zeros). Transposed operands are strided views of XLA's
buffers: no copy. The offsets are a ``cumsum`` in XLA and stay on the GPU; each GEMM is one XLA call
(``_ragged_launch``), which XLA may capture in a command buffer where traced inside
``command_buffers()``.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from .. import _grouped_version
from .._errors import NvblasltTypeError, NvblasltValueError
from .._loader import library
from . import _tuning
from ._bridge import vary_alike
from ._planning import dtype_of
from ._ragged_launch import Form, launch


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _grouped(a, b, offs, shape, out_dtype, capturable: bool, transposes=(False, False), zero_tail=True):
    """One grouped GEMM as an XLA call: ``zero_tail`` for a result split by rows (its rows past the
    groups' total zeroed in the same call); ``capturable`` lets a command buffer capture it."""
    form = Form((tuple(a.shape), tuple(b.shape), tuple(offs.shape), tuple(shape)), a.dtype.name,
                jnp.dtype(out_dtype).name, tuple(transposes), zero_tail)
    result = jax.ShapeDtypeStruct(shape, jnp.dtype(out_dtype))
    out = buffer_callback(partial(launch, form), result, command_buffer_compatible=capturable)(a, b, offs)
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
    if not _on_gpu():  # checked here, not in the custom VJP, whose traces JAX keeps
        raise NvblasltValueError(f"lhs, rhs: JAX's backend is {jax.default_backend()}, but nvblaslt.jax.ragged_dot "
                                 f"runs cuBLASLt on CUDA GPUs only")
    static = (out_dtype, _tuning.capturable())  # in the custom VJP's key: a trace inside command_buffers() differs
    return _ragged(static, *vary_alike((lhs, rhs, group_sizes)))  # under shard_map, typed alike


def _offsets(group_sizes):
    return jnp.cumsum(group_sizes.astype(jnp.int32)).astype(jnp.int32)


# Rows past the groups' total: the forward's and dlhs's are zeroed by the call that writes them (no pass
# of XLA's over the result); dout's there are never read, since only rows inside a group take part.
@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ragged(static, lhs, rhs, group_sizes):
    return _ragged_fwd(static, lhs, rhs, group_sizes)[0]


def _ragged_fwd(static, lhs, rhs, group_sizes):
    out_dtype, capturable = static
    offs = _offsets(group_sizes)
    out = _grouped(lhs, rhs, offs, (lhs.shape[0], rhs.shape[2]), out_dtype, capturable)
    return out, (lhs, rhs, group_sizes, offs)


def _ragged_bwd(static, residuals, dout):
    _, capturable = static
    lhs, rhs, group_sizes, offs = residuals
    dout = dout.astype(lhs.dtype)
    dlhs = _grouped(dout, rhs, offs, lhs.shape, lhs.dtype.name, capturable, transposes=(False, True))
    drhs = _grouped(lhs, dout, offs, rhs.shape, rhs.dtype.name, capturable, transposes=(True, False),
                    zero_tail=False)  # split along K: every group's result is written (empty ones as zeros)
    return dlhs, drhs, np.zeros(group_sizes.shape, jax.dtypes.float0)


_ragged.defvjp(_ragged_fwd, _ragged_bwd)
