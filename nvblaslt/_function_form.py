"""``matmul()``: one call, with a per-thread cache of plans so that like calls do not re-plan.

Two ways into the cache. The fast path, for CuPy and PyTorch arrays on the framework's current
stream, keys a plan on each array's fingerprint (pointer aside: shape, strides, dtype, device,
alignment) read straight off the array, with no DLPack export. Every other call reads its
operands, builds the key from what it read, and plans on a miss.
"""

from __future__ import annotations

import threading
from typing import Any
from collections import OrderedDict

from . import _cuda, _epilogs, _operands
from ._epilogs import as_epilog
from ._errors import NvblasltTypeError, NvblasltValueError
from ._options import MatmulOptions, MatmulPlanPreferences, as_options, with_shortcuts
from ._outputs import OutputChecker
from ._plan import Matmul
from ._problem import canonical
from ._frameworks import framework_of
from ._hints import Array, EpilogLike, Options, Preferences, QuantizationScales, Result, ScalarLike, Stream
from ._reading import one_package
from ._streams import stream_handle

_CACHE_SIZE = 64
_local = threading.local()
_DEFAULT_OPTIONS = MatmulOptions()
_DEFAULT_PREFERENCES = MatmulPlanPreferences()


class _Plans(OrderedDict):
    """One thread's plans, least recently used first. The fast path also keeps the last key it hit
    (its plan is the last entry): a loop calling with like arrays compares that key instead of
    hashing it and reordering the dict (0.5 µs a call, H200 host)."""

    last_key: tuple | None = None
    last_plan: Matmul | None = None


def _signature(op) -> tuple | None:
    # conjugated: a lazy-conjugate view has the same memory layout as its base, but another plan
    return None if op is None else (op.shape, op.strides, op.dtype, op.device, op.alignment, op.conjugated)


_fast_paths: dict[type, tuple | None] = {}  # array type -> (framework, read layouts, current stream on a device)


def _fast_path(a) -> tuple | None:
    """The fast path's readers for arrays of ``a``'s type (found once per type), or None."""
    cls = type(a)
    if cls in _fast_paths:
        return _fast_paths[cls]
    framework = framework_of(a)
    read = framework.layout_reader(cls)
    path = _fast_paths[cls] = None if read is None else (framework, read, framework.stream_on)
    return path


def matmul(a: Array, b: Array, /, c: Array | None = None, *, alpha: ScalarLike | None = None, beta: ScalarLike | None = None,
           epilog: EpilogLike = None, epilog_inputs: dict[str, Any] | None = None, qualifiers: Any = None,
           quantization_scales: QuantizationScales = None, options: Options = None, preferences: Preferences = None,
           algorithm: Any = None, stream: Stream | None = None, out: Array | None = None, compute_type: Any = None,
           result_type: Any = None) -> Result:
    """D = epilog(alpha · a @ b + beta · c) in one call; returns D, or ``(D, aux)`` when the epilog
    has outputs. nvmath-python's ``matmul`` with the same arguments and semantics (NumPy matmul
    rules for 1-D and batched operands, C as (M, N) or a broadcast (M, 1), host operands staged),
    plus nvblaslt's ``out=`` and the ``compute_type=`` / ``result_type=`` shortcuts.

    Plans are cached per thread, keyed on shapes, strides, dtypes, alignment, device, package
    and epilog, so repeated calls with like operands do not re-plan."""
    try:
        cache = _local.plans
    except AttributeError:
        cache = _local.plans = _Plans()
    if epilog_inputs is not None and not isinstance(epilog_inputs, dict):
        raise NvblasltTypeError(f"epilog_inputs: expected a dict, got {type(epilog_inputs).__name__}")
    fast_key = None
    # Fast path: CuPy/PyTorch device arrays on the framework's own stream (no handshake due), with no
    # out=, scales, options or preferences. The key is the arrays' layouts, read with no DLPack export.
    if stream is None and out is None and options is None and qualifiers is None and algorithm is None \
            and quantization_scales is None and preferences is None:
        path = _fast_paths.get(type(a)) or _fast_path(a)
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
                    if fast_key == cache.last_key:
                        plan = cache.last_plan
                    else:
                        plan = cache.get(fast_key)
                        if plan is not None:
                            cache.move_to_end(fast_key)  # least recently used goes first when the cache is full
                            cache.last_key, cache.last_plan = fast_key, plan
                except Exception:  # noqa: BLE001 - an unhashable or odd argument: the checked path says what is wrong
                    plan = fast_key = None
                if plan is not None:
                    if alpha is not None or beta is not None or pointers != plan.fast_bound:
                        plan.rebind(pointers, names, 1.0 if alpha is None else alpha, 0.0 if c is None else beta)
                        # the same arrays with the default scalars next time need no rebinding (0.7 µs)
                        plan.fast_bound = pointers if alpha is None and beta is None else None
                    framework_stream = stream_on(layout[0][3])  # a's device
                    if plan.several_devices and _cuda.current_device() != plan.device:
                        with _cuda.on_device(plan.device):
                            return plan.run(framework_stream, framework_stream, None)
                    return plan.run(framework_stream, framework_stream, None)
    return _checked_call(framework_of(a), cache, fast_key, a, b, c, alpha, beta, epilog, epilog_inputs,
                         qualifiers, quantization_scales, options, preferences, algorithm, stream, out, compute_type,
                         result_type)


def _checked_call(framework, cache, fast_key, a, b, c, alpha, beta, epilog, epilog_inputs, qualifiers, quantization_scales,
                  options, preferences, algorithm, stream, out, compute_type, result_type):
    options = with_shortcuts(options, compute_type, result_type)
    prefs = as_options(MatmulPlanPreferences, preferences, "preferences") if preferences is not None else \
        _DEFAULT_PREFERENCES
    epilog = as_epilog(epilog)
    framework_stream = 0 if _operands.is_host_array(a) else framework.stream_of(a)
    stream_h = stream_handle(stream) if stream is not None else framework_stream
    # On the framework's own stream no handshake is needed, so arrays seen before are not re-exported.
    read = _operands.read_cached if stream_h == framework_stream else _operands.read
    given = [(x, name) for x, name in ((a, "a"), (b, "b"), (c, "c")) if x is not None]
    one_package(given)
    a_op, b_op = read(a, "a", stream_h), read(b, "b", stream_h)
    c_op = read(c, "c", stream_h) if c is not None else None
    host = a_op.host or b_op.host or (c_op is not None and c_op.host)
    # the fp8 aux scale is a number or a one-element array the plan reads at plan time, not an operand
    inputs = {k: (v if k == "aux_quantization_scale" else read(v, f"epilog_inputs['{k}']", stream_h))
              for k, v in (epilog_inputs or {}).items()}
    cacheable = not host and quantization_scales is None and qualifiers is None and algorithm is None \
        and not options.inplace and options.handle is None and options.logger is None \
        and "aux_quantization_scale" not in inputs
    key = None
    if cacheable:
        key = (framework, epilog, _signature(a_op), _signature(b_op), _signature(c_op),
               tuple((k, _signature(v)) for k, v in sorted(inputs.items())),
               _option_key(options), beta is None, _option_key(prefs))
        plan = cache.get(key)
    else:
        plan = None
    if plan is None:
        if _cuda.is_capturing(stream_h):
            raise NvblasltValueError(
                "stream: a CUDA graph is being captured on it, and planning allocates device memory, which "
                "capture forbids; call matmul() once with operands like these before capturing (the cached plan "
                "is then replayed), or capture Matmul.execute()")
        # the epilog's input names are checked before the constructor stages host operands to the GPU
        _epilogs.check_input_names(epilog, [k for k in inputs if k != "aux_quantization_scale"])
        plan = Matmul.from_operands(a_op, b_op, c_op, stream=stream_h, options=options, alpha=alpha, beta=beta,
                                     quantization_scales=quantization_scales, qualifiers=qualifiers)
        try:
            if out is not None:  # checked against the result's layout before the heuristics run
                OutputChecker(framework, a_op.host, canonical(plan.operands, epilog),
                              plan.device, {"a": a_op, "b": b_op, "c": c_op}, {}).pointer(out, stream_h)
            plan.plan(epilog=epilog, epilog_inputs=inputs, preferences=prefs,
                      algorithms=[algorithm] if algorithm is not None else None)
        except BaseException:
            plan.free()
            raise
        if cacheable:
            _remember(cache, key, plan)
    else:
        cache.move_to_end(key)
        cache.last_key = cache.last_plan = None  # the last fast-path plan is no longer the last entry
        plan.set_operands(a_op, b_op, c_op, inputs, 1.0 if alpha is None else alpha, 0.0 if c is None else beta)
    if fast_key is not None and cacheable and stream_h == framework_stream and out is None:
        _remember(cache, fast_key, plan)
    try:
        result = plan.execute(stream=stream_h, out=out)
    finally:
        if cacheable:
            plan.forget_arrays()  # a cached plan must not keep the caller's arrays alive
        else:
            plan.free()  # stream-ordered: after the work just queued
    return result


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


def _remember(cache: _Plans, key, plan: Matmul) -> None:
    cache[key] = plan
    cache.last_key = cache.last_plan = None  # the entry just added is the last one now
    while len(cache) > 2 * _CACHE_SIZE:  # a plan may sit under a slow key and a fast key
        evicted = cache.popitem(last=False)[1]
        if evicted not in cache.values():
            evicted.free()


def clear_plan_cache() -> None:
    """Free this thread's cached plans (the function form's)."""
    cache = getattr(_local, "plans", None)
    if cache is not None:
        cache.last_key = cache.last_plan = None
    while cache:
        plan = cache.popitem()[1]
        if plan not in cache.values():
            plan.free()
