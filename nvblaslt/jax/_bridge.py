"""The ``nvblaslt_gemm`` primitive: one nvblaslt GEMM as an XLA call, on XLA's stream and buffers.

Abstract evaluation is ``_planning``'s (nvblaslt's own shape rules, at trace time). On CUDA the
primitive lowers to ``jax.experimental.buffer_callback``: XLA calls back into Python with its
stream and its buffers, and the call launches a plan made on the first run and kept per thread,
keyed on everything static plus the stream and each pointer's alignment. A launch rebinds the
pointers and writes D and every epilog output straight into XLA's buffers. On any other platform
the lowering refuses by name. vmap folds the mapped axis into the GEMM's batch.
"""

from __future__ import annotations

import threading
from functools import lru_cache, partial

import jax
import numpy as np
from jax.experimental.buffer_callback import buffer_callback
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from .. import Matmul, _cuda, _memory
from .._errors import NvblasltValueError
from . import _tuning
from ._planning import Layout, Spec, outputs_of

_ALIGN = 256  # what a plan assumes of D and its epilog outputs (and XLA's allocations give)
_local = threading.local()
_scratch_copies = [0]  # outputs XLA placed below _ALIGN, written to scratch and copied over (a bench diagnostic)


# ---- the primitive -------------------------------------------------------------------------------
gemm_p = Primitive("nvblaslt_gemm")
gemm_p.multiple_results = True


def bind(spec: Spec, *arrays) -> list:
    """The GEMM's results as XLA buffers (D first, then the epilog outputs, in ``outputs_of`` order)."""
    return gemm_p.bind(*arrays, spec=spec)


def _abstract_eval(*avals, spec: Spec):
    _, outputs = outputs_of(spec)
    return [jax.core.ShapedArray(o.buffer_shape, np.dtype(jax.numpy.dtype(o.dtype))) for o in outputs]


gemm_p.def_abstract_eval(_abstract_eval)


@lru_cache(maxsize=256)
def _jitted(spec: Spec):
    return jax.jit(partial(bind, spec))


gemm_p.def_impl(lambda *arrays, spec: _jitted(spec)(*arrays))


def _gpu_lowering(*arrays, spec: Spec):
    _, outputs = outputs_of(spec)
    shapes = tuple(jax.ShapeDtypeStruct(o.buffer_shape, jax.numpy.dtype(o.dtype)) for o in outputs)
    return buffer_callback(partial(_launch, spec, outputs), shapes)(*arrays)


def _refuse_platform(ctx, *arrays, spec: Spec):
    platforms = ", ".join(ctx.module_context.platforms)
    raise NvblasltValueError(f"a, b: JAX arrays on {platforms}, but nvblaslt.jax runs cuBLASLt on CUDA GPUs only; "
                             f"put the computation on a GPU (jax.devices('gpu'))")


mlir.register_lowering(gemm_p, mlir.lower_fun(_gpu_lowering, multiple_results=True), platform="cuda")
for _platform in ("cpu", "rocm", "tpu"):
    mlir.register_lowering(gemm_p, _refuse_platform, platform=_platform)


def _batch_rule(arrays, dims, *, spec: Spec):
    """vmap: the mapped axis becomes the leading batch axis of every mapped operand; unmapped operands
    stay single matrices, which nvblaslt broadcasts over the batch (a batched GEMM, one launch)."""
    layouts = [spec.a, spec.b, *(() if spec.c is None else (spec.c,)), *(layout for _, layout in spec.inputs)]
    size = next(x.shape[d] for x, d in zip(arrays, dims) if d is not None)
    if dims[0] is None and dims[1] is None:  # only c or an epilog input is mapped
        arrays = [jax.numpy.broadcast_to(arrays[0], (size, *arrays[0].shape)), *arrays[1:]]
        dims = [0, *dims[1:]]
    moved, new_layouts = [], []
    for index, (x, d, layout) in enumerate(zip(arrays, dims, layouts)):
        if d is None:
            moved.append(x)
            new_layouts.append(layout)
            continue
        if index < 2 and len(layout.shape) < 2:
            raise NvblasltValueError(f"{'ab'[index]}: vmap over a 1-D operand is not supported (the mapped axis would "
                                     f"become a matrix dimension); give it its matrix axis first")
        moved.append(jax.numpy.moveaxis(x, d, 0))
        new_layouts.append(Layout((size, *layout.shape), layout.dtype, layout.transposed))
    count = 3 if spec.c is not None else 2
    new = Spec(new_layouts[0], new_layouts[1], new_layouts[2] if spec.c is not None else None,
               tuple((key, layout) for (key, _), layout in zip(spec.inputs, new_layouts[count:])),
               spec.epilog, spec.alpha, spec.beta, spec.options, spec.preferences, spec.scales)
    _, old_outputs = outputs_of(spec)
    _, new_outputs = outputs_of(new)
    results = []
    for buffer, old, new_output in zip(bind(new, *moved), old_outputs, new_outputs):
        caller = jax.numpy.transpose(buffer, new_output.to_caller)  # (size, …) as the caller's batched array
        old_caller_shape = tuple(old.buffer_shape[axis] for axis in old.to_caller)
        caller = caller.reshape((size, *old_caller_shape))  # a batched bias gradient is (…, M, 1), one is (M,)
        to_buffer = sorted(range(len(old.to_caller)), key=old.to_caller.__getitem__)
        results.append(jax.numpy.transpose(caller, (0, *(1 + axis for axis in to_buffer))))
    return results, [0] * len(results)


batching.primitive_batchers[gemm_p] = _batch_rule


# ---- the launch, in XLA's callback ----------------------------------------------------------------
def _pointer(buffer) -> int:
    return buffer.__cuda_array_interface__["data"][0]


def _alignment(pointer: int) -> int:
    return min(_ALIGN, pointer & -pointer) if pointer else _ALIGN


class _Entry:
    """One plan for one static GEMM on one stream, with its output setters prebuilt."""

    def __init__(self, spec: Spec, outputs, pointers: list, stream: int):
        device = _cuda.current_device()
        layouts = [("a", spec.a), ("b", spec.b)] + ([("c", spec.c)] if spec.c is not None else [])
        ops = {name: layout.operand(name, pointer, device) for (name, layout), pointer in zip(layouts, pointers)}
        inputs = {key: layout.operand(f"epilog_inputs['{key}']", pointer, device)
                  for (key, layout), pointer in zip(spec.inputs, pointers[len(layouts):])}
        self.plan = Matmul.from_operands(ops["a"], ops["b"], ops.get("c"), stream=stream,
                                         options=spec.matmul_options(), alpha=spec.alpha, beta=spec.beta,
                                         quantization_scales=dict(spec.scales) or None)
        self.plan.plan(epilog=spec.epilog, epilog_inputs=inputs or None,
                       preferences=dict(spec.preferences) or None)
        tuning = _tuning.active()
        self.generation = tuning.generation if tuning is not None else 0
        if tuning is not None:  # timed into scratch memory on XLA's stream: XLA's buffers are left as they are
            self.plan.autotune(iterations=tuning.iterations, search=tuning.search, stream=stream)
        if self.plan.split_form is not None:  # a searched two-call form allocates its outputs: run the fused one
            self.plan.split_form.free()
            self.plan.split_form = None
        self.names = tuple(key for key, _ in spec.inputs)
        self.has_c = spec.c is not None
        self.alpha, self.beta = spec.alpha, (0.0 if spec.beta is None else spec.beta)
        self.setters = [self.plan.launch.pointer_setter(o.attribute) for o in outputs[1:]]
        self.sizes = [int(np.prod(o.buffer_shape)) * np.dtype(jax.numpy.dtype(o.dtype)).itemsize for o in outputs]
        self.scratch: list = [None] * len(outputs)  # for an output XLA placed below 256-byte alignment

    def run(self, pointers: list, out_pointers: list, stream: int) -> None:
        given = pointers if self.has_c else [pointers[0], pointers[1], None, *pointers[2:]]
        self.plan.rebind(given, self.names, self.alpha, self.beta)
        targets = [p if _alignment(p) >= _ALIGN else self._scratch(i, stream) for i, p in enumerate(out_pointers)]
        for set_pointer, target in zip(self.setters, targets[1:]):
            set_pointer(target)
        self.plan.launch.run(targets[0], stream)
        for index, (target, pointer) in enumerate(zip(targets, out_pointers)):
            if target != pointer:
                _scratch_copies[0] += 1
                _cuda.check(_cuda.cudart.cudaMemcpyAsync(pointer, target, self.sizes[index],
                                                         _cuda.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
                                                         stream), "cudaMemcpyAsync")

    def free(self) -> None:
        self.plan.free()
        for buffer in self.scratch:
            if buffer is not None:
                buffer.release()

    def _scratch(self, index: int, stream: int) -> int:
        if self.scratch[index] is None:
            self.scratch[index] = _memory.DeviceBuffer(self.sizes[index], stream)
        return self.scratch[index].pointer


def _launch(spec: Spec, outputs, ctx, outs, *ins) -> None:
    """XLA's callback: the plan for this spec, stream and alignments (made on the first run), launched."""
    _tuning.count_entry()
    stream = int(ctx.stream)
    pointers = [_pointer(b) for b in ins]
    out_pointers = [_pointer(b) for b in (outs if isinstance(outs, (tuple, list)) else (outs,))]
    key = (spec, stream, tuple(_alignment(p) for p in pointers))
    try:
        plans = _local.plans
    except AttributeError:
        plans = _local.plans = {}
    entry = plans.get(key)
    tuning = _tuning.active()
    if entry is not None and tuning is not None and entry.generation != tuning.generation:
        entry.free()  # made before this autotune() context: made again, and timed
        entry = None
    if entry is None:
        entry = plans[key] = _Entry(spec, outputs, pointers, stream)
    entry.run(pointers, out_pointers, stream)


def clear_plans() -> None:
    """Free this thread's bridge plans (the next run of each GEMM plans again).

    XLA runs the callbacks in its own threads: call it where the GEMMs ran, or leave the plans to the
    process's end.

    Examples
    --------
    >>> import nvblaslt.jax
    >>> nvblaslt.jax.clear_plans()
    """
    plans = getattr(_local, "plans", {})
    for entry in plans.values():
        entry.free()
    plans.clear()


__all__ = ["bind", "clear_plans", "gemm_p"]
