"""``grouped_matmul``: the function form of grouped GEMM, with one cached plan per problem and thread.

A plan (``GroupedMatmul``) is made on the first call of a problem and reused by every later one
with the same groups, extents but the ragged one, dtypes, layout and alignment: a new token count
or new offsets run the same plan. Cached plans keep no caller's array; a plan that a CUDA graph
captured is never freed (the graph holds its arrays and workspace).
"""

from __future__ import annotations

from typing import Any, TypeVar

from . import _dtypes, _tuning_cache
from ._frameworks import fast_reader
from ._grouped import bind, cached_plan, function_plans, operand_spans, read_scales, stream_of
from ._hints import Array, Stream

ArrayT = TypeVar("ArrayT")  # the result is an array of the operands' package: a torch.Tensor for tensors

# one per thread (cuBLASLt handles are per thread), shared with the torch layer's bound calls (_grouped's);
# a plan's fast keys vary with the token count
_local = function_plans


def grouped_matmul(a: ArrayT, b: Array, offs: Array | None = None, *, out_dtype: Any = None, out: ArrayT | None = None,
                   stream: Stream | None = None, check_offsets: bool | None = None, scale_a: Array | None = None,
                   scale_b: Array | None = None) -> ArrayT:
    """``out_g = a_g · b_g`` for every group of a ragged split, in one cuBLASLt call (``torch._grouped_mm``).

    =====================  =====================  =================  =========================
    a                      b                      result             offs splits
    =====================  =====================  =================  =========================
    (ΣM, K)                (G, K, N)              (ΣM, N)            a's rows (tokens)
    (G, M, K)              (K, ΣN)                (M, ΣN)            b's columns
    (M, ΣK)                (ΣK, N)                (G, M, N)          K (a weight gradient)
    (G, M, K)              (G, K, N)              (G, M, N)          nothing (``offs`` None)
    =====================  =====================  =================  =========================

    Parameters
    ----------
    a, b : GPU arrays of any package (DLPack or ``__cuda_array_interface__``)
        bfloat16 or float16 (both the same), or fp8: float8_e4m3fn, or float8_e5m2 in one of the two
        (a gradient's format); each group's matrix row- or column-major. fp8 runs where cuBLASLt has
        kernels for it: on Hopper, with K contiguous in both operands
        (tokens row-major, weights stored ``(G, N, K)`` as ``nn.Linear`` keeps them).
    offs : 1-D int32 or int64 GPU array
        Cumulative group ends (``offs[g]`` is where group g ends; group 0 starts at 0). Never read on
        the host. Rows of a 2-D result past ``offs[-1]`` are left unwritten, as in PyTorch.
    out_dtype : dtype, optional
        The operands' dtype (default) or float32; for fp8 operands bfloat16 (default), float16 or
        float32.
    out : array, optional
        Where the result goes: the result's shape and dtype, row-major with every row starting on 16
        bytes (contiguous where a row is a multiple of 16 bytes); default a new array.
    stream : int or stream object, optional
        Default: the operands' package's current stream.
    check_offsets : bool, optional
        Wait for the GPU and refuse bad offsets (default ``$NVBLASLT_CHECK_OFFSETS``, read when a plan
        is made: set it before the first call, or call ``clear_grouped_plans()`` after changing it).
    scale_a, scale_b : GPU arrays, optional
        fp8 operands' per-tensor scales, one float32 value each, read on the GPU when the GEMM runs:
        ``out_g = scale_a · scale_b · a_g · b_g``. Default 1.

    Returns
    -------
    array
        The result, in the operands' package (``out`` if given).

    Raises
    ------
    NvblasltUnsupportedError
        cuBLASLt older than 13.4 (the message says how to get a newer one), or an unsupported dtype.
    NvblasltTypeError, NvblasltValueError
        Operands or offsets of the wrong kind, dtype, shape or device.
    CublasLtError
        cuBLASLt has no grouped algorithm for the problem on this GPU.

    Examples
    --------
    .. code-block:: python

        tokens = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)    # sorted by expert
        experts = torch.randn(8, 14336, 4096, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor([900, 2100, 2100, 4000, 5200, 6000, 7300, 8192], device="cuda", dtype=torch.int32)
        hidden = nvblaslt.grouped_matmul(tokens, experts.transpose(1, 2), offs)   # (8192, 14336)
    """
    cache = _local.plans
    if cache.generation != _tuning_cache.generation:  # a search stored a choice since
        cache.retire_tuned(lambda: stream_of(a, stream))
    fast_key = entry = None
    # Fast path: CuPy / PyTorch arrays on their package's current stream (no DLPack handshake due): the
    # layouts read straight off the arrays key the plan and the problem it was made for.
    if stream is None:
        path = fast_reader(a)
        if path is not None:
            _, read, stream_on = path
            try:
                found = read((a, b, offs, scale_a, scale_b))
                if found is not None:
                    fast_key = (found[1], out_dtype)
                    entry = cache.last_found if fast_key == cache.last_key else cache.find(fast_key)
            except Exception:  # noqa: BLE001 - an odd array or argument: the checked path says what is wrong
                found = fast_key = None
            if found is not None and entry is not None and entry[0]._captured:
                cache.keep_captured(entry[1])  # a graph captured it through the torch layer: a new plan
                entry = None
            if found is not None and entry is not None:
                (a_pointer, b_pointer, offs_pointer, scale_a_pointer, scale_b_pointer), layouts = found
                plan, key, problem, offs_64, spans = entry
                result = plan._run_pointers(problem, a_pointer, b_pointer, offs_pointer or 0, offs_64, out=out,
                                            spans=spans,
                                            stream=stream_on(layouts[0][3]), check_offsets=check_offsets,
                                            scales=(scale_a_pointer or 0, scale_b_pointer or 0))
                if plan._captured:  # the graph owns it now: eager calls get a plan of their own
                    cache.keep_captured(key)
                return result
    stream_h = stream_of(a, stream)
    dtype = _dtypes.parse(out_dtype, "out_dtype") if out_dtype is not None else None
    bound = bind(a, b, offs, stream_h, dtype)
    scales = read_scales(scale_a, scale_b, bound.problem, bound.operands[0].device, stream_h)
    plan, key = cached_plan(bound, a, b, offs, dtype, stream_h)
    if fast_key is not None:
        offs_op = bound.operands[2]
        offs_64 = offs_op is not None and offs_op.dtype == _dtypes.INT64
        cache.add_alias(fast_key, key, (plan, key, bound.problem, offs_64, operand_spans(bound)))
    result = plan.run(bound, out=out, stream=stream_h, check_offsets=check_offsets, scales=scales)
    if plan._captured:  # the graph owns it now: eager calls get a plan of their own, never racing its replays
        cache.keep_captured(key)
    return result


def clear_grouped_plans() -> None:
    """Free this thread's cached grouped plans (stream-ordered): their workspaces and arrays.

    These are ``grouped_matmul``'s plans and those ``nvblaslt.torch.grouped_mm``'s bound calls run (the same
    plans); a plan a CUDA graph captured stays held.

    Examples
    --------
    >>> import nvblaslt
    >>> nvblaslt.clear_grouped_plans()
    """
    _local.plans.clear()
