"""``grouped_mm`` (the custom op ``nvblaslt::grouped_mm``) and ``GroupedLinear``, a mixture-of-experts
layer's experts, with ``torch._grouped_mm``'s semantics.

On CUDA, for bfloat16 and float16, the op is ``nvblaslt.grouped_matmul``: one cuBLASLt call, the
offsets never read on the host. On any other device or dtype the same math runs as a loop of torch
matmuls (the reference the tests compare with). Every gradient is itself a grouped GEMM of another
form, so the backward runs through the same op:

====================  ======================================  ======================================
forward               grad a                                  grad b
====================  ======================================  ======================================
2-D a × 3-D b (M)     ``grouped_mm(g, bᵀ, offs)``   2d × 3d   ``grouped_mm(aᵀ, g, offs)``   2d × 2d
3-D a × 2-D b (N)     ``grouped_mm(g, bᵀ, offs)``   2d × 2d   ``grouped_mm(aᵀ, g, offs)``   3d × 2d
2-D a × 2-D b (K)     ``grouped_mm(g, bᵀ, offs)``   3d × 2d   ``grouped_mm(aᵀ, g, offs)``   2d × 3d
3-D a × 3-D b         ``grouped_mm(g, bᵀ)``         3d × 3d   ``grouped_mm(aᵀ, g)``         3d × 3d
====================  ======================================  ======================================

(ᵀ swaps the last two dimensions; g is the result's gradient.) A gradient comes out in its input's
memory order: for an input the forward ran column-major per group (a transposed view, as the experts'
weight enters, or the column-major copy of an expanded input whose ragged extent is the last), the
transposed product is computed and swapped back (``(b gᵀ)ᵀ``, ``(gᵀ a)ᵀ``), so that ``backward()``
takes the gradient of the tensor under the view as it is, without a copy, and no gradient asks more
alignment of the offsets than the forward did. As in
PyTorch, rows of a 2-D result past ``offs[-1]`` are left uninitialised on CUDA (zeros elsewhere), and
so are their gradients.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import NvblasltTypeError
from .._grouped_problem import padded_strides
from . import _grouped_bound
from ._eager import PLAIN, autograd_function, plain_eager
from ._tuning import first_search, tuning

_SCHEMA = "(Tensor a, Tensor b, Tensor? offs, ScalarType? out_dtype) -> Tensor"
_NATIVE = (torch.bfloat16, torch.float16)
_FP8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))


def _out_shape(a: Tensor, b: Tensor, offs: Tensor | None) -> tuple[int, ...]:
    if a.dim() == 2 and b.dim() == 3:
        return a.shape[0], b.shape[2]
    if a.dim() == 3 and b.dim() == 2:
        return a.shape[1], b.shape[1]
    if a.dim() == 2 and b.dim() == 2:
        if offs is None:
            raise ValueError("offs: expected the groups' cumulative ends along K for 2-D × 2-D operands, got None")
        return offs.shape[0], a.shape[0], b.shape[1]
    if a.dim() == 3 and b.dim() == 3:
        return a.shape[0], a.shape[1], b.shape[2]
    raise ValueError(f"a, b: expected 2-D or 3-D operands, got a of {a.dim()} and b of {b.dim()} dimensions")


def _reference(a: Tensor, b: Tensor, offs: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """The same result as a loop of torch matmuls (any device and dtype); unwritten rows are zeros. A wider
    result is computed in its own dtype, as cuBLASLt writes a float32 result of bfloat16 operands (not their
    bfloat16 product, cast), and fp8 operands are widened to the result's dtype."""
    if out_dtype.itemsize > a.dtype.itemsize or (a.dtype in _FP8 and out_dtype not in _FP8):
        a, b = a.to(out_dtype), b.to(out_dtype)
    out = a.new_zeros(_out_shape(a, b, offs), dtype=out_dtype)
    if a.dim() == 3 and b.dim() == 3:
        return torch.bmm(a, b).to(out_dtype)
    ends = offs.tolist() if offs is not None else []
    start = 0
    for g, end in enumerate(ends):
        if a.dim() == 2 and b.dim() == 3:
            out[start:end] = (a[start:end] @ b[g]).to(out_dtype)
        elif a.dim() == 3:
            out[:, start:end] = (a[g] @ b[:, start:end]).to(out_dtype)
        else:
            out[g] = (a[:, start:end] @ b[start:end]).to(out_dtype)
        start = end
    return out


def _matrix_order(t: Tensor) -> str | None:
    """"row" or "col" where each group's matrix of ``t`` is row- or column-major, else None (an expanded
    gradient, ``out.sum().backward()``'s, has zero strides)."""
    shape, strides = t.shape, t.stride()  # two reads, not five: each torch call costs ~0.3 µs of host time
    if len(shape) < 2:  # not an operand at all: passed on for grouped_matmul to refuse by name
        return "row"
    rows, cols, s0, s1 = shape[-2], shape[-1], strides[-2], strides[-1]
    if s1 == 1 and s0 >= max(cols, 1):
        return "row"
    if s0 == 1 and s1 >= max(rows, 1):
        return "col"
    return None


def _padded(t: Tensor) -> Tensor:
    """A row-major copy of ``t`` with every row on 16 bytes, as cuBLASLt's results are laid out."""
    return t.new_empty_strided(t.shape, padded_strides(tuple(t.shape), t.element_size())).copy_(t)


def _strided_ragged(t: Tensor, ragged: int) -> Tensor:
    """A copy of ``t`` whose ragged extent (dimension ``ragged``) is not along memory: there, every group
    would have to start on 16 bytes (cuBLASLt's rule; the derive kernel empties a group that does not)."""
    if ragged == t.dim() - 1:  # the ragged extent last: the transpose's rows, padded
        return _padded(t.transpose(-1, -2)).transpose(-1, -2)
    return _padded(t)


def _per_group_matrices(t: Tensor, ragged: int | None = None) -> Tensor:
    """``t`` itself where each group's matrix is row- or column-major, else a copy that keeps the ragged
    extent (dimension ``ragged`` of ``t``) off memory's contiguous one, which ``t`` never asked of its offsets."""
    if _matrix_order(t) is not None:
        return t
    return t.contiguous() if ragged is None else _strided_ragged(t, ragged)


def _runs_column_major(t: Tensor, ragged: int | None) -> bool:
    """Whether the forward ran ``t``'s groups column-major: a transposed view (the experts' weight enters
    as ``weight.transpose(1, 2)``), or a copy made so because its ragged extent is the last."""
    order = _matrix_order(t)
    if order is not None:
        return order == "col" and t.stride(-1) != 1
    return ragged is not None and ragged == t.dim() - 1


_RAGGED_DIMS = {(2, 3): (0, None), (3, 2): (None, 1), (2, 2): (1, 0), (3, 3): (None, None)}  # of a, of b


def _alignment(t: Tensor) -> int:
    """Bytes (at most 256) that ``t``'s pointer, leading dimension and group stride are multiples of: what
    the plan's alignment preferences, and so the tuning cache's key, hold of its layout."""
    itemsize = t.element_size()
    lead = max(t.stride()[-2:], default=1)
    value = t.data_ptr() | lead * itemsize | (t.stride(0) * itemsize if t.dim() == 3 else 0) | 256
    return value & -value


def _problem_key(a: Tensor, b: Tensor, offs: Tensor | None, dtype: torch.dtype) -> tuple:
    """The problem near enough as the tuning cache keys it: everything but the ragged extent's total, so
    that a new token count is not searched again (its plan recalls the choice made for another), but
    with each operand's alignment, which a new total can change (a column-major ``a``'s leading
    dimension is the total)."""
    ragged = _RAGGED_DIMS.get((a.dim(), b.dim()), (None, None))

    def layout(t: Tensor, dim: int | None) -> tuple:
        shape = tuple(-1 if i == dim else n for i, n in enumerate(t.shape))
        return shape, _matrix_order(t), t.stride(0) if t.dim() == 3 else None, _alignment(t), t.dtype, t.device
    return "grouped", layout(a, ragged[0]), layout(b, ragged[1]), None if offs is None else (offs.shape, offs.dtype), \
        dtype


def _tune(a: Tensor, b: Tensor, offs: Tensor | None, dtype: torch.dtype, iterations: int) -> None:
    """Search this problem on these operands (the heuristics' algorithms, then beyond them) and remember
    the fastest: ``grouped_matmul``'s cached plans are made again and recall it (here, in the autograd
    engine's thread, and in later processes)."""
    import nvblaslt

    with nvblaslt.GroupedMatmul(a, b, offs, out_dtype=dtype) as plan:
        plan.plan(limit=16)  # the heuristics' first pick can be 2x slower than the best of 16 (G=128, H100)
        plan.autotune(iterations=iterations, search=True, remember=True)


def _capturing(device: torch.device) -> bool:
    with torch.cuda.device(device):  # the op runs on this device's current stream
        return torch.cuda.is_current_stream_capturing()


def _native(a: Tensor, b: Tensor, offs: Tensor | None, dtype: torch.dtype) -> Tensor:
    """The cuBLASLt path: tuned first inside an ``nvblaslt.torch.autotune()`` context that has not seen
    the problem yet; bound (``_grouped_bound``) the second time a call passes it as it is."""
    import nvblaslt

    ragged_a, ragged_b = _RAGGED_DIMS.get((a.dim(), b.dim()), (None, None))
    a_given, b_given = a, b
    a, b = _per_group_matrices(a, ragged_a), _per_group_matrices(b, ragged_b)
    # never while a CUDA graph is captured (timing waits for the GPU); the problem stays unmarked, so a
    # later eager call in the same context tunes it
    if tuning():
        if not (a.is_cuda and _capturing(a.device)):
            iterations = first_search(lambda: _problem_key(a, b, offs, dtype))  # the key only while tuning
            if iterations is not None:
                _tune(a, b, offs, dtype, iterations)
    elif a is a_given and b is b_given and a.is_cuda:  # the operands as given (a copy's key would never come again)
        out = _grouped_bound.bind(a, b, offs, dtype)
        if out is not None:
            return out
    return nvblaslt.grouped_matmul(a, b, offs, out_dtype=dtype)


def _refuse_unscaled_fp8(a: Tensor, b: Tensor) -> None:
    """fp8 on CUDA has no unscaled grouped GEMM (torch's matmuls refuse it too): say where the scaled one is."""
    for name, t in (("a", a), ("b", b)):
        if t.is_cuda and t.dtype in _FP8:
            raise NvblasltTypeError(f"{name}: {t.dtype} operands on CUDA need their scales: call "
                                    f"nvblaslt.grouped_matmul(a, b, offs, scale_a=…, scale_b=…), which takes "
                                    f"torch tensors and returns one (forward only); grouped_mm takes bfloat16, "
                                    f"float16 or float32")


def _grouped_mm_impl(a, b, offs, out_dtype):
    out = _grouped_bound.run(a, b, offs, out_dtype)  # a call like one checked before: pointers alone
    if out is not None:
        return out
    dtype = out_dtype or a.dtype
    if a.is_cuda and a.dtype in _NATIVE:  # (a b of another dtype is refused by grouped_matmul, by name)
        return _native(a, b, offs, dtype)
    _refuse_unscaled_fp8(a, b)  # off the hot path: only what would run as torch matmuls
    return _reference(a, b, offs, dtype)


@torch.library.custom_op("nvblaslt::grouped_mm", mutates_args=(), schema=_SCHEMA)
def _grouped_mm_op(a, b, offs, out_dtype):
    return _grouped_mm_impl(a, b, offs, out_dtype)


@_grouped_mm_op.register_fake
def _grouped_mm_fake(a, b, offs, out_dtype):
    _refuse_unscaled_fp8(a, b)
    dtype, shape = out_dtype or a.dtype, _out_shape(a, b, offs)
    if a.is_cuda and a.dtype in _NATIVE:  # cuBLASLt's result: every row on 16 bytes, as the real op returns it
        return a.new_empty_strided(shape, padded_strides(shape, dtype.itemsize), dtype=dtype)
    return a.new_empty(shape, dtype=dtype)


def _setup_context(ctx, inputs, output):
    a, b, offs, out_dtype = inputs
    ctx.save_for_backward(a, b, offs)
    ctx.set_materialize_grads(False)


def _swap(t: Tensor) -> Tensor:
    return t.transpose(-1, -2)


_OUT_RAGGED = {(2, 3): 0, (3, 2): 1}  # the result's ragged dimension, by the operands' dimensions


def _grouped_mm_autograd(ctx, grad):
    if grad is None:
        return None, None, None, None
    a, b, offs = ctx.saved_tensors
    ragged_a, ragged_b = _RAGGED_DIMS[(a.dim(), b.dim())]
    out_ragged = _OUT_RAGGED.get((a.dim(), b.dim()))
    wide = grad.element_size()
    grad = grad.to(a.dtype)  # (an expanded gradient comes out of the cast contiguous)
    # g's ragged extent along memory asks every group to start on 16 bytes of g's dtype: more than the
    # forward asked where its result's was not along memory (N=1), or was in a wider dtype (float32 out)
    if out_ragged is not None and grad.shape[out_ragged] > 1 and grad.stride(out_ragged) == 1 and not (
            out_ragged == grad.dim() - 1 and grad.element_size() >= wide):
        grad = _strided_ragged(grad, out_ragged)
    needs = ctx.needs_input_grad
    # Each gradient in its input's memory order: for an input the forward ran column-major (a transposed
    # view, such as the experts' weight) the transposed product, swapped back. The gradient of the tensor
    # under the view then comes out contiguous and autograd takes it as its .grad instead of copying it (a
    # transposing copy of every expert's weight gradient: 7.5 GB a step for DeepSeek-V3), and the call asks
    # no more alignment of the offsets than the forward did.
    grad_a = grad_b = None
    if needs[0]:
        grad_a = _swap(_call(b, _swap(grad), offs, a.dtype)) if _runs_column_major(a, ragged_a) \
            else _call(grad, _swap(b), offs, a.dtype)
    if needs[1]:
        grad_b = _swap(_call(_swap(grad), a, offs, b.dtype)) if _runs_column_major(b, ragged_b) \
            else _call(_swap(a), grad, offs, b.dtype)
    return grad_a, grad_b, None, None


_grouped_mm_op.register_autograd(_grouped_mm_autograd, setup_context=_setup_context)
_GroupedMM = autograd_function("GroupedMM", _grouped_mm_impl, _setup_context, _grouped_mm_autograd)


_grad_enabled = torch._C.is_grad_enabled


def _call(a: Tensor, b: Tensor, offs: Tensor | None, out_dtype: torch.dtype | None) -> Tensor:
    """The op, or in plain eager mode (plain tensors with data: ``_eager.direct``'s test, inline) its
    implementation and autograd formula without its dispatch."""
    if type(a) in PLAIN and type(b) in PLAIN and (offs is None or type(offs) in PLAIN) and plain_eager() \
            and not (a.is_meta or b.is_meta or (offs is not None and offs.is_meta)):
        if _grad_enabled() and (a.requires_grad or b.requires_grad):
            return _GroupedMM.apply(a, b, offs, out_dtype)
        return _grouped_mm_impl(a, b, offs, out_dtype)
    return torch.ops.nvblaslt.grouped_mm(a, b, offs, out_dtype)


def grouped_mm(a: Tensor, b: Tensor, offs: Tensor | None = None, *, out_dtype: torch.dtype | None = None) -> Tensor:
    """``torch._grouped_mm``'s grouped GEMM as one cuBLASLt call, differentiable in ``a`` and ``b``.

    Parameters
    ----------
    a, b : Tensor
        2-D or 3-D (``nvblaslt.grouped_matmul`` lists the four forms); bfloat16 or float16 run on
        cuBLASLt, anything else (or a CPU tensor) as torch matmuls.
    offs : Tensor, optional
        1-D int32 cumulative group ends along the ragged extent; None for 3-D × 3-D.
    out_dtype : torch.dtype, optional
        The result's dtype: the operands' (default) or float32.

    Returns
    -------
    Tensor
        The result (``torch.compile(fullgraph=True)`` and CUDA graphs take the op as it is).

    Examples
    --------
    >>> import torch
    >>> from nvblaslt.torch import grouped_mm
    >>> tokens, experts = torch.randn(5, 3, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    >>> out = grouped_mm(tokens, experts, torch.tensor([2, 5], dtype=torch.int32))
    >>> torch.allclose(out[2:], tokens[2:] @ experts[1])
    True
    """
    return _call(a, b, offs, out_dtype)


class GroupedLinear(nn.Module):
    """The experts of a mixture-of-experts layer: ``nn.Linear`` per group, over tokens sorted by group.

    ``forward(x, offs)`` gives ``x[s:e] @ weight[g].T`` for group g's rows ``s:e`` of ``x``, all
    groups in one grouped GEMM (``grouped_mm``). The weight is ``(groups, out_features,
    in_features)``, each group's initialised as ``nn.Linear`` initialises its own.

    Parameters
    ----------
    groups, in_features, out_features : int
        The number of experts and each one's extents.
    device, dtype : optional
        Where and what the weight is.

    Examples
    --------
    >>> import torch
    >>> from nvblaslt.torch import GroupedLinear
    >>> experts = GroupedLinear(4, 16, 32, dtype=torch.float64)
    >>> x = torch.randn(10, 16, dtype=torch.float64)
    >>> offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)   # expert 1 gets no token
    >>> experts(x, offs).shape
    torch.Size([10, 32])
    """

    def __init__(self, groups: int, in_features: int, out_features: int, *, device=None, dtype=None):
        super().__init__()
        self.groups, self.in_features, self.out_features = groups, in_features, out_features
        self.weight = nn.Parameter(torch.empty(groups, out_features, in_features, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for expert in self.weight.data:  # nn.Linear's init, per expert
            nn.init.kaiming_uniform_(expert, a=math.sqrt(5))

    def forward(self, x: Tensor, offs: Tensor) -> Tensor:
        """Every expert's ``nn.Linear`` on its rows of ``x``, in one grouped GEMM.

        Parameters
        ----------
        x : torch.Tensor
            (tokens, in_features), sorted by expert.
        offs : torch.Tensor
            1-D int32, (groups,): where each expert's rows end.

        Returns
        -------
        torch.Tensor
            (tokens, out_features).
        """
        return grouped_mm(x, self.weight.transpose(1, 2), offs)

    def extra_repr(self) -> str:
        return f"groups={self.groups}, in_features={self.in_features}, out_features={self.out_features}"
