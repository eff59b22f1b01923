"""One GEMM from JAX arrays: the checks that need no GPU, the static spec, and the results in the
caller's layout. Transposed operands are passed as flags on their buffers (cuBLASLt reads them
column-major): ``gemm(x, w, a_transposed=True)`` is xᵀ @ w with no copy of x.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from .._dtypes import FLOAT8
from .._epilogs import SPECS, MatmulEpilog, as_epilog
from .._errors import NvblasltTypeError, NvblasltValueError
from .._options import MatmulQuantizationScales
from ._bridge import bind
from ._planning import Layout, Spec, dtype_of, options_of, outputs_of, preference_pairs

_REFUSED = {"qualifiers": "conjugate with jnp.conj before the call",
            "algorithm": "autotune with nvblaslt.Matmul on like CuPy arrays: the tuning cache applies here",
            "stream": "XLA's own stream is used", "out": "XLA allocates every result"}


def refuse_unavailable(**given) -> None:
    """Arguments of ``nvblaslt.matmul`` that have no meaning inside a JAX program, refused by name."""
    for name, value in given.items():
        if value is not None:
            raise NvblasltValueError(f"{name}: not available in nvblaslt.jax ({_REFUSED[name]}); got "
                                     f"{type(value).__name__}")


def scalar(value, name: str):
    """alpha / beta as a static Python number (a JAX program's GEMM is planned for it)."""
    if value is None:
        return None
    if isinstance(value, jax.core.Tracer):
        raise NvblasltTypeError(f"{name}: expected a Python number (static: the GEMM is planned for it), got a "
                                f"traced JAX value; pass a number, or scale the result with jnp")
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        return value.item() if hasattr(value, "item") else value
    if getattr(value, "shape", None) in ((), (1,)):
        number = jax.device_get(value).reshape(()).item()
        return number
    raise NvblasltTypeError(f"{name}: expected a number, got {type(value).__name__}")


def as_array(value, name: str):
    """A JAX array (NumPy arrays are taken as constants); one placed off GPU is refused by name."""
    if value is None:
        raise NvblasltTypeError(f"{name}: expected an array, got None")
    if not isinstance(value, (jax.Array, jax.core.Tracer)):
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise NvblasltTypeError(f"{name}: expected a JAX array, got {type(value).__name__}")
        value = jnp.asarray(value)
    if not isinstance(value, jax.core.Tracer):
        platforms = {device.platform for device in value.devices()}
        if platforms != {"gpu"}:
            raise NvblasltValueError(f"{name}: a JAX array on {', '.join(sorted(platforms))}; nvblaslt.jax runs "
                                     f"cuBLASLt on CUDA GPUs only (jax.device_put it to a GPU)")
    dtype_of(value.dtype, name)  # a dtype nvblaslt has no name for is refused here, by name
    return value


def fp8_scales(quantization_scales, aux_scale) -> tuple[tuple, list]:
    """The fp8 scales (``quantization_scales`` by key, ``aux_quantization_scale`` as "aux"): numbers as
    static (key, float) pairs, JAX arrays as (key, array) to pass as buffers (a traced scale, new every
    step, changes no plan). Which keys must or may have one is checked with the problem (``_planning``)."""
    given = {}
    if quantization_scales is not None:
        if isinstance(quantization_scales, MatmulQuantizationScales):
            quantization_scales = {key: getattr(quantization_scales, key) for key in "abcd"}
        if not isinstance(quantization_scales, dict):
            raise NvblasltTypeError(f"quantization_scales: expected a dict with keys among 'a', 'b', 'c', 'd' or "
                                    f"MatmulQuantizationScales, got {type(quantization_scales).__name__}")
        unknown = sorted(map(str, set(quantization_scales) - set("abcd")))
        if unknown:
            raise NvblasltValueError(f"quantization_scales: expected keys among 'a', 'b', 'c', 'd', got {unknown}")
        given = {key: (value, f"quantization_scales['{key}']") for key, value in quantization_scales.items()}
    if aux_scale is not None:
        given["aux"] = (aux_scale, "epilog_inputs['aux_quantization_scale']")
    fixed, arrays = [], []
    for key, (value, name) in sorted(given.items()):
        if value is None:
            continue
        if isinstance(value, (jax.Array, jax.core.Tracer)):
            if value.dtype != jnp.float32 or value.shape not in ((), (1,)):
                raise NvblasltValueError(f"{name}: expected a number or a float32 JAX array of shape () or (1,), "
                                         f"got a {value.dtype} array of shape {value.shape}")
            arrays.append((key, as_array(value, name)))
            continue
        if isinstance(value, bool) or not (isinstance(value, numbers.Real) or
                                           getattr(value, "shape", None) in ((), (1,))):
            raise NvblasltTypeError(f"{name}: expected a number or a float32 JAX array, got {type(value).__name__}")
        number = float(value.reshape(()) if hasattr(value, "reshape") else value)  # NumPy scalars and arrays too
        if not abs(number) <= float(jnp.finfo(jnp.float32).max):  # NaN and infinities are refused too
            raise NvblasltValueError(f"{name}: {value!r} is not a finite float32 value")
        fixed.append((key, number))
    return tuple(fixed), arrays


def gemm(a, b, c=None, *, alpha=None, beta=None, epilog=None, epilog_inputs=None, options=None, preferences=None,
         quantization_scales=None, compute_type=None, result_type=None, a_transposed: bool = False,
         b_transposed: bool = False) -> tuple:
    """(D, {key: epilog output}) in the caller's layout; ``*_transposed`` reads that operand's last two
    axes swapped, without a copy."""
    epilog = as_epilog(epilog)
    if epilog_inputs is not None and not isinstance(epilog_inputs, dict):
        raise NvblasltTypeError(f"epilog_inputs: expected a dict, got {type(epilog_inputs).__name__}")
    a, b = as_array(a, "a"), as_array(b, "b")
    if dtype_of(b.dtype, "b") in FLOAT8 and b.ndim >= 2 and not b_transposed:
        # cuBLASLt's fp8 kernels read B column-major (the 'TN' layout); XLA's buffers are row-major: give it
        # b's transpose, which XLA mostly fuses into the op that made b (its quantization)
        b, b_transposed = jnp.swapaxes(b, -1, -2), True
    arrays = [a, b]
    c_layout = None
    if c is not None:
        c = as_array(c, "c")
        if SPECS[epilog].needs_column_major and c.ndim >= 2:  # D follows c's order: give it c column-major
            arrays.append(jnp.swapaxes(c, -1, -2))
            c_layout = Layout(tuple(arrays[-1].shape), dtype_of(c.dtype, "c").name, True)
        else:
            arrays.append(c)
            c_layout = Layout(tuple(c.shape), dtype_of(c.dtype, "c").name)
    inputs = []
    given = dict(epilog_inputs or {})
    fixed_scales, scale_arrays = fp8_scales(quantization_scales, given.pop("aux_quantization_scale", None))
    for key, value in sorted(given.items()):
        name = f"epilog_inputs['{key}']"
        value = as_array(value, name)
        transposed = key in ("relu_aux", "gelu_aux") and value.ndim >= 2  # as the forward returned it: column-major
        arrays.append(jnp.swapaxes(value, -1, -2) if transposed else value)
        inputs.append((key, Layout(tuple(arrays[-1].shape), dtype_of(value.dtype, name).name, transposed)))
    arrays += [value for _, value in scale_arrays]
    spec = Spec(Layout(tuple(a.shape), dtype_of(a.dtype, "a").name, a_transposed and a.ndim >= 2),
                Layout(tuple(b.shape), dtype_of(b.dtype, "b").name, b_transposed and b.ndim >= 2),
                c_layout, tuple(inputs), epilog, 1 if alpha is None else scalar(alpha, "alpha"),
                scalar(beta, "beta"), options_of(options, compute_type, result_type),
                preference_pairs(preferences), fixed_scales, tuple(key for key, _ in scale_arrays))
    if c is None and spec.beta is not None:
        raise NvblasltValueError("beta: given without c; pass c (the matrix beta scales) or drop beta")
    if c is not None and spec.beta is None:
        raise NvblasltValueError("beta: A value for beta must be provided if operand C is provided")
    return run(spec, arrays)


def run(spec: Spec, arrays: list) -> tuple:
    _, outputs = outputs_of(spec)  # planned on shapes: a problem nvblaslt refuses is refused here, by name
    buffers = bind(spec, *arrays)
    results = [jnp.transpose(x, o.to_caller) if o.to_caller != tuple(range(x.ndim)) else x
               for x, o in zip(buffers, outputs)]
    return results[0], {o.key: x for o, x in zip(outputs[1:], results[1:])}


def activation_of(epilog: MatmulEpilog) -> str | None:
    """"none", "relu" or "gelu" for a forward epilog (DEFAULT, BIAS, RELU*, GELU*), read off cuBLASLt's
    names; None for the backward epilogs, which have no gradient here."""
    name = epilog.name
    if name in ("DEFAULT", "BIAS"):
        return "none"
    for activation in ("relu", "gelu"):
        if name.startswith(activation.upper()):
            return activation
    return None


def keeping_aux(activation: str, bias: bool) -> MatmulEpilog:
    """The forward epilog that also returns the activation's aux (its backward's input)."""
    return MatmulEpilog.__members__[f"{activation.upper()}_AUX{'_BIAS' if bias else ''}"]


def backward_epilog(activation: str, bias_gradient: bool) -> MatmulEpilog:
    """DRELU / DGELU, or their _BGRAD forms: the activation's backward fused into a GEMM's output."""
    return MatmulEpilog.__members__[f"D{activation.upper()}{'_BGRAD' if bias_gradient else ''}"]
