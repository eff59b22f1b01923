"""``nvblaslt.jax.matmul``: nvblaslt's ``matmul`` inside ``jax.jit``, differentiable for the forward epilogs.

The gradient (``jax.custom_vjp``) of D = act(alpha·a@b + beta·c + bias):
dz = dD · act'(z), from D itself for ReLU and from the kept pre-activation (the GELU_AUX form's
aux, run in the forward in place of GELU / GELU_BIAS) for GELU; then da = alpha·dz bᵀ,
db = alpha·aᵀ dz, dc = beta·dz, each summed over what was broadcast, and the bias gradient dz
summed over N. The bias gradient is not fused here: dz is row-major, and cuBLASLt 13.1 has BGRADA
kernels only for a column-major A (refused on an H200). The activation's backward inside a GEMM
(DRELU_BGRAD / DGELU_BGRAD) needs the GEMM that follows the activation: ``dense`` chains do that.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .._epilogs import SPECS, as_epilog
from .._errors import NvblasltTypeError, NvblasltUnsupportedError
from ._bridge import vary_alike
from ._gemm import activation_of, as_array, fp8_scales, gemm, keeping_aux, refuse_unavailable, scalar
from ._planning import options_of, preference_pairs, preferences_of


def matmul(a, b, /, c=None, *, alpha=None, beta=None, epilog=None, epilog_inputs=None, qualifiers=None,
           quantization_scales=None, options=None, preferences=None, algorithm=None, stream=None, out=None,
           compute_type=None, result_type=None):
    """``D = epilog(alpha * a @ b + beta * c)`` as one cuBLASLt call inside a JAX program.

    nvblaslt's ``matmul`` with the same arguments and rules (NumPy ``matmul`` rules for 1-D and
    batched operands, a bias with one value per row of D, the compute and result types), for JAX
    arrays on a CUDA GPU, usable under ``jax.jit``, ``jax.grad`` and ``jax.vmap``. Shapes and
    dtypes of the results are nvblaslt's, computed at trace time; the plan is made on the first
    run and reused (the tuning cache applies).

    Parameters
    ----------
    a, b : jax.Array
        A (…, M, K) or (K,), B (…, K, N) or (K,), on a GPU. Positional only.
    c : jax.Array, optional
        C, (…, M, N) or a column (…, M, 1); requires ``beta``.
    alpha, beta : number, optional
        Python numbers (static: the GEMM is planned for them); a traced value is refused.
    epilog : MatmulEpilog, str or int, optional
        Any of the 16 epilogs.
    epilog_inputs : dict, optional
        ``"bias"`` (one value per row of D), ``"relu_aux"`` / ``"gelu_aux"`` as a forward epilog
        returned them, and ``"aux_quantization_scale"`` (a number or a float32 JAX array of shape
        () or (1,)) with an fp8 GELU aux (``preferences={"epilog": {"aux_type": …}}``).
    quantization_scales : dict or MatmulQuantizationScales, optional
        fp8 scales (keys ``"a"``, ``"b"``, ``"c"``, ``"d"``), each a number (static: planned for it)
        or a float32 JAX array of shape () or (1,), traced or not, read on the GPU at each launch: a
        new value every step (delayed scaling) makes no new trace or plan. Numbers and arrays mix.
        An fp8 ``b`` is handed to cuBLASLt transposed (its fp8 kernels read B column-major), a
        transpose XLA mostly fuses into the op that made ``b``.
    options, preferences, compute_type, result_type
        As in ``nvblaslt.matmul`` (static). ``options.inplace``, ``handle`` and ``logger`` are refused;
        ``options={"result_amax": True}`` returns an fp8 result's amax.
    qualifiers, algorithm, stream, out
        Refused by name: XLA owns the stream and the results.

    Returns
    -------
    jax.Array or tuple of (jax.Array, dict)
        D, or ``(D, aux)`` for an epilog with outputs or ``options.result_amax``, ``aux`` holding
        JAX arrays by nvblaslt's keys (``"relu_aux"``, ``"gelu_aux"``, ``"drelu_bgrad"``,
        ``"dgelu_bgrad"``, ``"bgrada"``, ``"bgradb"``, and the float32 (1,) amaxes
        ``"gelu_aux_amax"`` and ``"result_amax"``), each shaped as ``nvblaslt.matmul`` returns it.

    Raises
    ------
    NvblasltTypeError
        An argument that is no JAX array, a traced ``alpha`` / ``beta``, a dtype nvblaslt does not
        know, unhashable options.
    NvblasltValueError
        Shapes that do not multiply, missing or unexpected epilog inputs, arrays not on a GPU (at
        the call for concrete arrays, at lowering for traced ones), an argument refused inside JAX;
        a missing or unexpected fp8 scale, a scale array not float32 of one element, ``vmap`` over
        a scale, ``result_amax`` of a result that is not fp8.
    NvblasltArgumentError
        A combination of dtypes cuBLASLt cannot multiply, a bias of the wrong dtype.
    NvblasltUnsupportedError
        ``jax.grad`` through a backward epilog, fp8 (scaled) operands, or complex operands.

    Notes
    -----
    ``jax.grad`` differentiates the forward epilogs (DEFAULT, BIAS, RELU*, GELU*) with respect to
    ``a``, ``b``, ``c`` and the bias; the aux outputs carry no gradient. ``jax.vmap`` folds the
    mapped axis into the GEMM's batch: one strided-batched launch, unmapped operands broadcast.
    GELU is cuBLASLt's tanh form.

    Examples
    --------
    On a GPU (the results are JAX arrays):

    .. code-block:: python

        import jax, jax.numpy as jnp
        import nvblaslt.jax as nj

        @jax.jit
        def layer(a, b, bias):
            y, aux = nj.matmul(a, b, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
            return y, aux["relu_aux"]      # relu(a @ b + bias[:, None]) and its ReLU bitmask

        grads = jax.grad(lambda a, b, bias: nj.matmul(a, b, epilog="GELU_BIAS",
                                                      epilog_inputs={"bias": bias}).sum(), argnums=(0, 1, 2))
    """
    refuse_unavailable(qualifiers=qualifiers, algorithm=algorithm, stream=stream, out=out)
    epilog = as_epilog(epilog)
    if epilog_inputs is not None and not isinstance(epilog_inputs, dict):
        raise NvblasltTypeError(f"epilog_inputs: expected a dict, got {type(epilog_inputs).__name__}")
    activation = activation_of(epilog)
    inputs = dict(epilog_inputs or {})
    if quantization_scales is not None and fp8_scales(quantization_scales, None) == ((), []):
        quantization_scales = None  # no scale in it (an empty dict, MatmulQuantizationScales()): differentiable
    if activation is None or quantization_scales is not None or set(inputs) - {"bias"}:
        d, aux = gemm(a, b, c, alpha=alpha, beta=beta, epilog=epilog, epilog_inputs=epilog_inputs, options=options,
                      preferences=preferences, quantization_scales=quantization_scales, compute_type=compute_type,
                      result_type=result_type)
        return (d, aux) if aux else d
    static = (epilog, 1 if alpha is None else scalar(alpha, "alpha"), scalar(beta, "beta"),
              options_of(options, compute_type, result_type), preference_pairs(preferences))
    operands = vary_alike((as_array(a, "a"), as_array(b, "b"), None if c is None else as_array(c, "c"),
                           None if "bias" not in inputs else as_array(inputs["bias"], "epilog_inputs['bias']")))
    d, aux = _differentiable(static, *operands)  # under shard_map, its inputs vary alike (as its gradients do)
    return (d, aux) if SPECS[epilog].outputs else d


def _forward(static, a, b, c, bias, keep: bool):
    epilog, alpha, beta, options, preferences = static
    activation = activation_of(epilog)
    run_epilog = keeping_aux("gelu", bias is not None) if keep and activation == "gelu" else epilog
    return gemm(a, b, c, alpha=alpha, beta=beta, epilog=run_epilog,
                epilog_inputs=None if bias is None else {"bias": bias}, options=dict(options),
                preferences=preferences_of(preferences))


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _differentiable(static, a, b, c, bias):
    d, aux = _forward(static, a, b, c, bias, keep=False)
    return d, aux


def _differentiable_fwd(static, a, b, c, bias):
    for name, x in (("a", a), ("b", b)):
        if jnp.issubdtype(x.dtype, jnp.complexfloating) or x.dtype.itemsize == 1:
            raise NvblasltUnsupportedError(f"{name}: jax.grad through nvblaslt.jax.matmul takes real 16-, 32- or "
                                           f"64-bit operands, got {x.dtype}")
    d, aux = _forward(static, a, b, c, bias, keep=True)
    kept = {k: v for k, v in aux.items() if k in SPECS[static[0]].outputs}
    gelu_aux = aux.get("gelu_aux")
    return (d, kept), (a, b, c, bias, d if activation_of(static[0]) == "relu" else None, gelu_aux)


def _wide(dtype):
    """The type elementwise backward math runs in: float32 at least (float64 stays float64)."""
    return jnp.promote_types(dtype, jnp.float32)


def gelu_derivative(z):
    """d/dz of the tanh GELU cuBLASLt computes, in float32 at least."""
    z = z.astype(_wide(z.dtype))
    k = 0.7978845608028654  # √(2/π)
    inner = k * (z + 0.044715 * z ** 3)
    t = jnp.tanh(inner)
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * k * (1 + 3 * 0.044715 * z * z)


def activation_backward(dd, activation: str, d, gelu_aux):
    """dz from dD: through ReLU by D's sign, through GELU by its kept pre-activation (rows past M are padding)."""
    if activation == "relu":
        return jnp.where(d > 0, dd, jnp.zeros_like(dd))
    if activation == "gelu":
        m = dd.shape[-2] if dd.ndim >= 2 else None
        z = gelu_aux[..., :m, :] if m is not None else gelu_aux.reshape(dd.shape)
        z = z.reshape(dd.shape) if m is None else z
        return (dd.astype(_wide(dd.dtype)) * gelu_derivative(z)).astype(dd.dtype)
    return dd


def _summed_to(x, shape):
    """``x`` summed over the axes it was broadcast along to reach its shape, then reshaped to ``shape``."""
    extra = x.ndim - len(shape)
    if extra > 0:
        x = x.sum(axis=tuple(range(extra)))
    keep = tuple(axis for axis, n in enumerate(shape) if n == 1 and x.shape[axis] != 1)
    if keep:
        x = x.sum(axis=keep, keepdims=True)
    return x.reshape(shape)


def _differentiable_bwd(static, residuals, cotangents):
    epilog, alpha, beta, options, preferences = static
    a, b, c, bias, d, gelu_aux = residuals
    dd = cotangents[0]
    activation = activation_of(epilog)
    dz = activation_backward(dd, activation, d, gelu_aux)
    # the operands as matrices: a row (K,) is (1, K), a column (K,) is (K, 1); dz gets the axes they lacked
    a2 = a if a.ndim >= 2 else a[None, :]
    b2 = b if b.ndim >= 2 else b[:, None]
    dz2 = dz if a.ndim >= 2 else jnp.expand_dims(dz, -2 if b.ndim >= 2 else 0)
    if b.ndim < 2:
        dz2 = jnp.expand_dims(dz2, -1)
    keywords = dict(options=dict((k, v) for k, v in options if k != "result_type"),  # no epilog: no aux preferences
                    preferences=preferences_of(tuple((k, v) for k, v in preferences if k != "epilog")))
    da, _ = gemm(dz2.astype(b2.dtype), b2, alpha=alpha, b_transposed=True, **keywords)
    db, _ = gemm(a2, dz2.astype(a2.dtype), alpha=alpha, a_transposed=True, **keywords)
    bias_grad = None
    if bias is not None:
        row_sums = dz2.astype(_wide(dz2.dtype)).sum(-1)  # fused by XLA with dz's own elementwise pass
        column = bias.ndim >= 2 and bias.shape[-1] == 1  # (…, M, 1)
        bias_grad = _summed_to(row_sums[..., None] if column else row_sums, bias.shape).astype(bias.dtype)
    dc = None if c is None else _summed_to((beta * dz.astype(_wide(dz.dtype))), c.shape).astype(c.dtype)
    return (_summed_to(da, a.shape).astype(a.dtype), _summed_to(db, b.shape).astype(b.dtype), dc, bias_grad)


_differentiable.defvjp(_differentiable_fwd, _differentiable_bwd)
