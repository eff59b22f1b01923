"""``matmul()``: one call, with a per-thread cache of plans so that like calls do not re-plan.

Two ways into the cache. The fast path, for CuPy and PyTorch arrays on the framework's current
stream, keys a plan on each array's fingerprint (pointer aside: shape, strides, dtype, device,
alignment) read straight off the array, with no DLPack export. Every other call reads its
operands, builds the key from what it read, and plans on a miss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from . import _cuda, _operands, _tuning_cache
from ._errors import NvblasltTypeError, NvblasltValueError
from ._outputs import check_out_allowed
from ._plan import Matmul
from ._plan_cache import PlanCache, PlanCaches, forget_layer_plans
from ._frameworks import fast_reader, framework_of
from ._hints import Array, EpilogLike, Options, Preferences, QuantizationScales, Result, ScalarLike, Stream
from ._request import MatmulRequest, read_request
from ._streams import stream_handle

if TYPE_CHECKING:  # for type checkers only: the API reference shows these names, not their 24 values
    from ._epilogs import MatmulEpilog

    # What an epilog gives back decides matmul()'s static result (_epilogs.SPECS: outputs or none), by
    # member and by name in upper or lower case; another case, an int, or an epilog known only at run time
    # is typed as either form.
    EpilogWithOutputs = Literal[
        MatmulEpilog.RELU_AUX, MatmulEpilog.RELU_AUX_BIAS, MatmulEpilog.GELU_AUX, MatmulEpilog.GELU_AUX_BIAS,
        MatmulEpilog.DRELU_BGRAD, MatmulEpilog.DGELU_BGRAD, MatmulEpilog.BGRADA, MatmulEpilog.BGRADB,
        "RELU_AUX", "RELU_AUX_BIAS", "GELU_AUX", "GELU_AUX_BIAS", "DRELU_BGRAD", "DGELU_BGRAD", "BGRADA", "BGRADB",
        "relu_aux", "relu_aux_bias", "gelu_aux", "gelu_aux_bias", "drelu_bgrad", "dgelu_bgrad", "bgrada", "bgradb"]
    EpilogWithoutOutputs = Literal[
        MatmulEpilog.DEFAULT, MatmulEpilog.RELU, MatmulEpilog.BIAS, MatmulEpilog.RELU_BIAS, MatmulEpilog.GELU,
        MatmulEpilog.GELU_BIAS, MatmulEpilog.DRELU, MatmulEpilog.DGELU,
        "DEFAULT", "RELU", "BIAS", "RELU_BIAS", "GELU", "GELU_BIAS", "DRELU", "DGELU",
        "default", "relu", "bias", "relu_bias", "gelu", "gelu_bias", "drelu", "dgelu"]

# The operand a's type: results come back in a's package (and memory space).
ArrayT = TypeVar("ArrayT")

_CACHE_SIZE = 64  # plans per thread
# one per thread: a plan's fast key, under which the fast path finds it (a few per plan at most)
_local = PlanCaches(_CACHE_SIZE, alias_limit=4 * _CACHE_SIZE)


# fast_reader()'s answer by array type, looked up without a call (an array type's package never changes)
_readers: dict[type, tuple | None] = {}
_UNREAD = ()


def _signature(op) -> tuple | None:
    # conjugated: a lazy-conjugate view has the same memory layout as its base, but another plan
    return None if op is None else (op.shape, op.strides, op.dtype, op.device, op.alignment, op.conjugated)


@overload
def matmul(a: ArrayT, b: Array, /, c: Array | None = ..., *, alpha: ScalarLike | None = ...,
           beta: ScalarLike | None = ..., epilog: EpilogWithOutputs, epilog_inputs: dict[str, Any] | None = ...,
           qualifiers: Any = ..., quantization_scales: QuantizationScales = ..., options: Options = ...,
           preferences: Preferences = ..., algorithm: Any = ..., stream: Stream | None = ..., out: Array | None = ...,
           compute_type: Any = ..., result_type: Any = ...) -> tuple[ArrayT, dict[str, ArrayT]]: ...
@overload
def matmul(a: ArrayT, b: Array, /, c: Array | None = ..., *, alpha: ScalarLike | None = ...,
           beta: ScalarLike | None = ..., epilog: EpilogWithoutOutputs | None = ...,
           epilog_inputs: dict[str, Any] | None = ..., qualifiers: Any = ...,
           quantization_scales: QuantizationScales = ..., options: Options = ..., preferences: Preferences = ...,
           algorithm: Any = ..., stream: Stream | None = ..., out: Array | None = ..., compute_type: Any = ...,
           result_type: Any = ...) -> ArrayT: ...
@overload
def matmul(a: ArrayT, b: Array, /, c: Array | None = ..., *, alpha: ScalarLike | None = ...,
           beta: ScalarLike | None = ..., epilog: EpilogLike, epilog_inputs: dict[str, Any] | None = ...,
           qualifiers: Any = ..., quantization_scales: QuantizationScales = ..., options: Options = ...,
           preferences: Preferences = ..., algorithm: Any = ..., stream: Stream | None = ..., out: Array | None = ...,
           compute_type: Any = ..., result_type: Any = ...) -> ArrayT | tuple[ArrayT, dict[str, ArrayT]]: ...
def matmul(a: Array, b: Array, /, c: Array | None = None, *, alpha: ScalarLike | None = None, beta: ScalarLike | None = None,
           epilog: EpilogLike = None, epilog_inputs: dict[str, Any] | None = None, qualifiers: Any = None,
           quantization_scales: QuantizationScales = None, options: Options = None, preferences: Preferences = None,
           algorithm: Any = None, stream: Stream | None = None, out: Array | None = None, compute_type: Any = None,
           result_type: Any = None) -> Result:
    """Compute ``D = epilog(alpha * a @ b + beta * c)`` in one call, with a cached plan.

    nvmath-python's ``matmul`` with the same arguments and semantics: NumPy ``matmul`` rules for
    1-D and batched operands, ``c`` as (M, N) or a column (M, 1) broadcast over N, host operands
    staged to the GPU. nvblaslt adds ``out=`` and the ``compute_type=`` / ``result_type=``
    shortcuts, and reads operands of any package that exports DLPack or
    ``__cuda_array_interface__``.

    Plans are cached per thread, keyed on the operands' shapes, strides, dtypes, pointer
    alignment, device and package, the epilog and the options, so repeated calls with like
    operands do not re-plan (see Notes).

    Parameters
    ----------
    a : array
        A, (…, M, K), or (K,) for a row: a GPU array of any package (CuPy, PyTorch, JAX, Numba,
        anything with ``__dlpack__`` or ``__cuda_array_interface__``), or a host array (NumPy, a
        CPU torch tensor), staged to the GPU ``options.device_id``. Positional only.
    b : array
        B, (…, K, N), or (K,) for a column; from the same package and memory space as ``a``.
        Positional only. Batch dimensions must match ``a``'s, or one of the two is a single
        matrix broadcast over the other's batch.
    c : array, optional
        C, (…, M, N), or a column (…, M, 1) broadcast over N; a 2-D ``c`` serves every batch.
        Requires ``beta``. With ``options={"inplace": True}`` the result is written into ``c``.
    alpha : number or one-element array, optional
        Scales ``a @ b``; default 1. A one-element array is read as a number (a GPU one is copied
        back, which waits for it). Complex only with complex operands.
    beta : number or one-element array, optional
        Scales ``c``: required with ``c``, refused without it (as in nvmath-python).
    epilog : MatmulEpilog, str or int, optional
        What to fuse after the multiplication: a ``MatmulEpilog`` member, its name (any case) or
        its cuBLASLt value; None is ``MatmulEpilog.DEFAULT`` (no epilog).
    epilog_inputs : dict, optional
        The arrays the epilog reads, by key: ``"bias"`` (one value per row of D: (M,), (M, 1),
        or batched (…, M, 1) / (…, M)), ``"relu_aux"`` / ``"gelu_aux"`` (as the forward epilog
        returned them, for ``DRELU*`` / ``DGELU*``), and ``"aux_quantization_scale"`` (a number,
        the scale of an fp8 GELU aux output). Exactly the keys the epilog reads are accepted.
    qualifiers : numpy.ndarray, optional
        nvmath-python's length-3 array of ``nvblaslt.matrix_qualifiers_dtype`` (A, B, C): its
        ``is_conjugate`` fields conjugate ``a`` and/or ``b`` (complex operands; conjugating C is
        refused).
    quantization_scales : MatmulQuantizationScales or dict, optional
        Scales for fp8 operands and results, keys ``"a"``, ``"b"``, ``"c"``, ``"d"``: required
        for every fp8 operand and an fp8 result, refused for any other.
    options : MatmulOptions or dict, optional
        How the multiplication is set up (compute and result types, ``inplace``, ``blocking``,
        ``handle``, ``memory_limit``, …); a dict takes the same keys, and nvmath-python's own
        ``MatmulOptions`` is accepted too.
    preferences : MatmulPlanPreferences or dict, optional
        What the heuristics may return (``limit``, ``workspace_limit``, ``epilog`` preferences…).
    algorithm : HeuristicResult, optional
        Run this algorithm instead of asking the heuristics: one that ``Matmul.plan()`` or
        ``Matmul.autotune()`` returned, nvmath-python's ``Algorithm``, or the 64 bytes of
        ``HeuristicResult.as_bytes()``. cuBLASLt checks it for this problem first.
    stream : int or stream object, optional
        Where the work is queued: a ``cudaStream_t`` as an int (0, 1 and 2 are CUDA's legacy,
        explicit legacy and per-thread default streams), a CuPy or PyTorch stream, a cuda.bindings
        stream, or anything with ``__cuda_stream__``. Default: the operands' package's current
        stream (the legacy default stream for host operands).
    out : array, optional
        nvblaslt's addition: write D into this array of the operands' package instead of a new
        one. It must be laid out as D would be (shape, dtype and element strides), on the plan's
        GPU, writable, 256-byte aligned (as the plan's algorithms assume), and apart from ``a``,
        ``b`` and the epilog inputs (it may be ``c`` itself). Not available with host operands or
        ``options.inplace``.
    compute_type : str or int, optional
        Shortcut for ``options.compute_type`` (a name such as ``"tf32"`` or
        ``"COMPUTE_32F_FAST_TF32"``, or a ``cublasComputeType_t`` value).
    result_type : str, dtype or int, optional
        Shortcut for ``options.result_type`` (a dtype name, a NumPy / CuPy / PyTorch dtype, or a
        ``cudaDataType`` value).

    Returns
    -------
    array or tuple of (array, dict)
        D, as an array of the operands' package (CuPy, PyTorch, JAX, Numba; NumPy or a CPU
        tensor for host operands, already copied back; a ``DeviceArray`` for every other
        package) and memory space; it is ``c`` itself with ``options.inplace``. Its memory order
        is ``c``'s, else column-major for epilogs with a bias, an aux or a bias gradient, else
        ``a``'s. An epilog with outputs, or ``options.result_amax``, returns ``(D, aux)``, with
        ``aux`` a dict of arrays of the same package:

        - ``"relu_aux"``: the ReLU bitmask of ``RELU_AUX`` / ``RELU_AUX_BIAS``, uint8, (…, ⌈M/128⌉·16, N)
          column-major, to give back to ``DRELU`` / ``DRELU_BGRAD``;
        - ``"gelu_aux"``: the GELU input of ``GELU_AUX`` / ``GELU_AUX_BIAS``, (…, M rounded up to 8,
          N) column-major, in D's type (or ``preferences.epilog.aux_type``);
        - ``"drelu_bgrad"``, ``"dgelu_bgrad"``, ``"bgrada"``: bias gradients, (M,), or (…, M, 1)
          for a batch; ``"bgradb"``: (N,), or (…, N, 1);
        - ``"gelu_aux_amax"`` (with ``preferences.epilog.aux_amax``) and ``"result_amax"`` (with
          ``options.result_amax``): float32 arrays of shape (1,).

        To a type checker the result has ``a``'s type: D alone where ``epilog`` is omitted, None, or
        a member or name (upper or lower case) of an epilog without outputs, ``tuple[A, dict[str, A]]``
        (A: ``a``'s type) for ``RELU_AUX``, ``RELU_AUX_BIAS``, ``GELU_AUX``, ``GELU_AUX_BIAS``,
        ``DRELU_BGRAD``, ``DGELU_BGRAD``, ``BGRADA`` and ``BGRADB``, and either form for an epilog
        known only at run time (a variable, an int, a name in mixed case). A checker cannot see
        ``options.result_amax``: with it, ``typing.cast`` the result to the tuple. Where ``a`` is a
        subclass (``torch.nn.Parameter``) the result is its package's array (``torch.Tensor``), and
        where its package has no adapter, a ``DeviceArray``.

    Raises
    ------
    NvblasltTypeError
        An argument of a type nvblaslt cannot use: ``epilog_inputs`` that is not a dict, an
        epilog that is neither a member, a name nor a value, ``options`` / ``preferences`` that
        are neither a dict nor their class, an object that is no array, operands from different
        packages, an unreadable ``stream``, an ``out`` of another dtype.
    NvblasltValueError
        Shapes that do not multiply (K, batch, ``c``'s shape), ``beta`` missing with ``c`` or
        given without it, an unknown epilog name, missing or unexpected epilog inputs, an invalid
        option value, an ``out`` laid out otherwise than D, or a plan needed while a CUDA graph is
        being captured on ``stream`` (planning allocates device memory, which capture forbids).
    NvblasltArgumentError
        A dtype or combination of dtypes cuBLASLt cannot multiply, operands or epilog inputs in
        different memory spaces (host and GPU), a bias or aux of the wrong dtype. Both a
        ``TypeError`` and a ``ValueError``.
    NvblasltAlgorithmError
        ``algorithm`` is not an algorithm (also an ``AssertionError``, as nvmath-python raises).
    CublasLtError
        cuBLASLt has no algorithm for the problem (``CUBLAS_STATUS_NOT_SUPPORTED``, with what is
        known of why), or refuses the launch.
    CudaError
        A CUDA runtime call failed: device memory, a copy, or no usable GPU and driver.

    Warns
    -----
    UserWarning
        ``result_type`` (or ``options.result_type``) is given with ``options.inplace``: the result
        is ``c`` itself, of ``c``'s dtype, and the result type is ignored (as in nvmath-python).

    See Also
    --------
    Matmul : the stateful form: plan once, autotune, execute many times.
    clear_plan_cache : frees this thread's cached plans.

    Notes
    -----
    A call nvmath-python accepts runs with only the import changed, and where nvmath-python
    refuses, nvblaslt refuses too, naming the argument; every check that needs no GPU runs before
    any GPU work (host operands are not copied before their shapes and dtypes are checked).

    The work is queued on ``stream`` and the call returns without waiting, unless the operands
    are host arrays (the result is copied back, which waits) or ``options.blocking`` is True.

    The plan cache is per thread and bounded (the least recently used plans are freed first);
    a cached plan keeps no reference to the caller's arrays. Calls with host operands,
    ``quantization_scales``, ``qualifiers``, ``algorithm``, ``options.inplace``,
    ``options.handle``, ``options.logger`` or an fp8 aux scale are not cached: their plan is made,
    run and freed (stream-ordered) in the call. CuPy and PyTorch arrays on their package's current
    stream, with none of ``stream``, ``out``, ``options``, ``preferences``, ``qualifiers``,
    ``algorithm`` or ``quantization_scales``, take a faster path that reads each array's layout
    directly. A call that would plan inside a CUDA graph capture is refused; one whose plan is
    cached can be captured.

    cuBLASLt's GELU is the tanh approximation, not the exact erf form.

    Examples
    --------
    On a GPU, a fused layer and its backward pass, with CuPy arrays (the results are CuPy arrays):

    .. code-block:: python

        import cupy
        from nvblaslt import matmul, MatmulEpilog

        a = cupy.random.rand(100, 784, dtype=cupy.float32)
        b = cupy.random.rand(784, 256, dtype=cupy.float32)
        bias = cupy.random.rand(100, dtype=cupy.float32)

        y, aux = matmul(a, b, epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
        # y = relu(a @ b + bias[:, None]); aux["relu_aux"] is the ReLU bitmask for the backward pass
        dy = cupy.ones_like(y)
        dz, grads = matmul(cupy.eye(100, dtype=cupy.float32), dy, epilog="DRELU_BGRAD",
                           epilog_inputs={"relu_aux": aux["relu_aux"]})
        db = grads["drelu_bgrad"]                             # (100,): the rows of dz summed

        z = matmul(a, b, c=y, beta=0.5, compute_type="tf32")  # a @ b + 0.5 * y in TF32
        d = matmul(a, b)
        matmul(a, b, out=d)                                   # into d again: no allocation

    Arguments are checked before any GPU work, so this refusal needs no GPU:

    >>> import numpy as np
    >>> import nvblaslt
    >>> a, b = np.ones((4, 3), np.float32), np.ones((5, 2), np.float32)
    >>> nvblaslt.matmul(a, b)
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: a, b: The 'K' extent must match for the operands: K=3 in operand A ...
    >>> nvblaslt.matmul(a, a.T, epilog_inputs=[1.0])
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltTypeError: epilog_inputs: expected a dict, got list
    """
    cache = _local.plans
    if cache.generation != _tuning_cache.generation:  # a search stored a choice since
        cache.retire_tuned(lambda: _stream_of(a, stream))
    if epilog_inputs is not None and not isinstance(epilog_inputs, dict):
        raise NvblasltTypeError(f"epilog_inputs: expected a dict, got {type(epilog_inputs).__name__}")
    fast_key = None
    # Fast path: CuPy/PyTorch device arrays on the framework's own stream (no handshake due), with no
    # out=, scales, options or preferences. The key is the arrays' layouts, read with no DLPack export.
    if stream is None and out is None and options is None and qualifiers is None and algorithm is None \
            and quantization_scales is None and preferences is None:
        cls = type(a)
        path = _readers.get(cls, _UNREAD)
        if path is _UNREAD:
            path = _readers[cls] = fast_reader(a)
        if path is not None:
            framework, read, stream_on = path
            names = tuple(epilog_inputs) if epilog_inputs else ()
            try:
                found = read((a, b, c, *epilog_inputs.values()) if epilog_inputs else (a, b, c))
            except Exception:  # noqa: BLE001 - an odd tensor (sparse, nested…): the checked path says what is wrong
                found = None
            if found is not None:
                pointers, layout = found
                fast_key = (framework, epilog, compute_type, result_type, beta is None, names, layout)
                try:
                    plan = cache.last_found if fast_key == cache.last_key else cache.find(fast_key)
                except Exception:  # noqa: BLE001 - an unhashable or odd argument: the checked path says what is wrong
                    plan = fast_key = None
                if plan is not None:
                    if alpha is not None or beta is not None or pointers != plan._fast_bound:
                        # the same arrays with the default scalars next time need no rebinding (0.7 µs)
                        plan._rebind(pointers, names, 1.0 if alpha is None else alpha, 0.0 if c is None else beta,
                                     keep=alpha is None and beta is None)
                    framework_stream = stream_on(layout[0][3])  # a's device
                    if plan._several_devices and _cuda.current_device() != plan.device:
                        with _cuda.on_device(plan.device):
                            return plan._run(framework_stream, framework_stream, None)
                    return plan._run(framework_stream, framework_stream, None)
    request = read_request(a, b, c, alpha=alpha, beta=beta, epilog=epilog, epilog_inputs=epilog_inputs,
                           qualifiers=qualifiers, quantization_scales=quantization_scales, options=options,
                           preferences=preferences, algorithm=algorithm, stream=stream, out=out,
                           compute_type=compute_type, result_type=result_type)
    return _checked_call(cache, fast_key, request)


def _checked_call(cache: PlanCache[Matmul], fast_key, request: MatmulRequest):
    key = _key(request) if request.cacheable else None
    plan = cache.get(key) if key is not None else None
    if request.out is not None:  # before host operands are staged
        check_out_allowed(request.host, request.options.inplace)
    if plan is None:
        if _cuda.is_capturing(request.stream):
            raise NvblasltValueError(
                "stream: a CUDA graph is being captured on it, and planning allocates device memory, which "
                "capture forbids; call matmul() once with operands like these before capturing (the cached plan "
                "is then replayed), or capture Matmul.execute()")
        plan = Matmul._planned_for(request, stacklevel=4)
        if key is not None:
            cache.add(key, plan)
    else:
        plan._set_operands(request.a, request.b, request.c, request.inputs, *request.scalars)
    if fast_key is not None and key is not None and request.stream == request.framework_stream \
            and request.out is None:
        cache.add_alias(fast_key, key, plan)
    try:
        result = plan.execute(stream=request.stream, out=request.out)
    finally:
        if key is not None:
            plan._forget_arrays()  # a cached plan must not keep the caller's arrays alive
        else:
            plan.free()  # stream-ordered: after the work just queued
    return result


def _key(request: MatmulRequest) -> tuple:
    """The checked path's cache key: what of the call decides its plan."""
    return (request.framework, request.epilog, _signature(request.a), _signature(request.b), _signature(request.c),
            tuple((k, _signature(v)) for k, v in sorted(request.inputs.items())), _option_key(request.options),
            request.beta is None, _option_key(request.preferences))


def _option_key(value) -> tuple:
    """A hashable key of an options dataclass (enum members by value)."""
    items = []
    for name, field in value.__dataclass_fields__.items():
        item = getattr(value, name)
        if hasattr(item, "__dataclass_fields__"):
            item = _option_key(item)
        elif not isinstance(item, (int, float, str, bool, type(None), tuple)):
            item = (type(item).__name__, str(item))
        items.append(item)
    return tuple(items)


def clear_plan_cache() -> None:
    """Free the plans ``matmul()`` has cached in the calling thread.

    Each plan's descriptors, workspace and other device memory are released, stream-ordered after
    the work already queued with them; the next ``matmul()`` call plans again. The bound steps of
    ``nvblaslt.torch``'s layers in this thread are forgotten too (each is freed, stream-ordered, once
    no autograd graph still holds it; those a CUDA graph captured stay). Other threads' caches are
    left as they are. Calling it with nothing cached does nothing.

    Use it to give back device memory held by plans no longer needed, or so that the next calls
    plan afresh, for example to start from what a later ``Matmul.autotune(search=True)`` remembered
    for the same problem.

    See Also
    --------
    matmul : the function form, whose plans these are.

    Examples
    --------
    >>> import nvblaslt
    >>> nvblaslt.clear_plan_cache()   # nothing cached in this thread yet: nothing to free
    """
    _local.plans.clear()
    forget_layer_plans()


def _stream_of(a, stream) -> int:
    """The call's stream, as ``_checked_call`` will read it."""
    if stream is not None:
        return stream_handle(stream)
    return 0 if _operands.is_host_array(a) else framework_of(a).stream_of(a)
