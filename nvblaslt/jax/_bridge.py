"""The ``nvblaslt_gemm`` primitive: one nvblaslt GEMM as an XLA call, on XLA's stream and buffers.

Abstract evaluation is ``_planning``'s (nvblaslt's own shape rules, at trace time). On CUDA the
primitive lowers to ``jax.experimental.buffer_callback``: XLA calls back into Python with its
stream and its buffers, and the call launches a plan made on the first run and kept per thread,
keyed on everything static plus the GPU, the stream and each pointer's alignment. The GPU is the
one XLA's buffers live on (under ``shard_map`` each GPU runs its own calls, on its own stream,
often from its own thread), made current for the plan and its launches. A launch rebinds the
pointers and writes D and every epilog output straight into XLA's buffers. Under a command
buffer's stream capture (``command_buffers()``), nothing may allocate: the call runs the plan its
first, uncaptured run made, and that plan is kept for the replays. On any other platform the
lowering refuses by name. vmap folds the mapped axis into the GEMM's batch.
"""

from __future__ import annotations

import threading
from functools import lru_cache, partial

import jax
import numpy as np
from jax.experimental.buffer_callback import buffer_callback
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import Matmul, _cuda, _dlpack, _memory
from .._dtypes import FLOAT8
from .._errors import NvblasltUnsupportedError, NvblasltValueError
from . import _tuning
from ._planning import Layout, Spec, outputs_of, scale_attributes

_ALIGN = 256  # what a plan assumes of D and its epilog outputs (and XLA's allocations give)
_AMAX_ALIGN = 16  # what an amax output needs
_local = threading.local()
_stream_devices: dict[int, int] = {}  # XLA's stream → the GPU it belongs to (read once per stream)
_latest: dict[tuple, _Entry] = {}  # (spec, GPU, alignments) → its newest plan, for a capture on another stream
_captured: list[_Entry] = []  # plans a command buffer replays: never freed
_scratch_copies = [0]  # outputs XLA placed below _ALIGN, written to scratch and copied over (a bench diagnostic)


# ---- the primitive -------------------------------------------------------------------------------
gemm_p = Primitive("nvblaslt_gemm")
gemm_p.multiple_results = True


def bind(spec: Spec, *arrays, capturable: bool | None = None) -> list:
    """The GEMM's results as XLA buffers (D first, then the epilog outputs, in ``outputs_of`` order);
    ``capturable`` (default: inside ``command_buffers()``) lets a command buffer capture the call."""
    return gemm_p.bind(*vary_alike(list(arrays)), spec=spec,
                       capturable=_tuning.capturable() if capturable is None else capturable)


def _abstract_eval(*avals, spec: Spec, capturable: bool):
    _, outputs = outputs_of(spec)
    return [_typed_like(avals[0], o.buffer_shape, np.dtype(jax.numpy.dtype(o.dtype))) for o in outputs]


def _typed_like(aval, shape: tuple, dtype):
    """A result's type: its shape and dtype, and the operands' type under ``shard_map`` (the mesh axes
    they vary over: every operand was made to vary alike). Without it, ``shard_map``'s type check
    takes a per-shard result for one every shard holds alike, and its gradient would be summed."""
    try:
        return aval.update(shape=shape, dtype=dtype, weak_type=False)
    except TypeError:  # a JAX whose types carry no such fields
        return jax.core.ShapedArray(shape, dtype)


def _varying_axes(x) -> frozenset:
    """The ``shard_map`` mesh axes ``x`` varies over (empty outside ``shard_map``)."""
    aval = jax.typeof(x)
    axes = getattr(aval, "vma", None)  # JAX ≤ 0.9 names them so
    if axes is None:
        axes = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    return frozenset(axes or ())


def vary_alike(tree):
    """``tree``'s arrays, each made to vary over every ``shard_map`` axis any of them varies over (no
    data moves; the gradient of an array that was the same on every shard is summed over them, as
    JAX's own operations do). Outside ``shard_map``, ``tree`` as it is."""
    leaves, structure = jax.tree_util.tree_flatten(tree)
    axes = [_varying_axes(x) for x in leaves]
    union = frozenset().union(*axes)
    if not union or all(a == union for a in axes):
        return tree
    cast = getattr(jax.lax, "pcast", None)
    leaves = [x if a == union else (cast(x, tuple(sorted(union - a)), to="varying") if cast is not None
                                    else jax.lax.pvary(x, tuple(sorted(union - a))))
              for x, a in zip(leaves, axes)]
    return jax.tree_util.tree_unflatten(structure, leaves)


gemm_p.def_abstract_eval(_abstract_eval)


@lru_cache(maxsize=256)
def _jitted(spec: Spec, capturable: bool):
    return jax.jit(partial(bind, spec, capturable=capturable))


gemm_p.def_impl(lambda *arrays, spec, capturable: _jitted(spec, capturable)(*arrays))


def _gpu_lowering(*arrays, spec: Spec, capturable: bool):
    _, outputs = outputs_of(spec)
    shapes = tuple(jax.ShapeDtypeStruct(o.buffer_shape, jax.numpy.dtype(o.dtype)) for o in outputs)
    return buffer_callback(partial(_launch, spec, outputs), shapes, command_buffer_compatible=capturable)(*arrays)


def _refuse_platform(ctx, *arrays, spec: Spec, capturable: bool):
    platforms = ", ".join(ctx.module_context.platforms)
    raise NvblasltValueError(f"a, b: JAX arrays on {platforms}, but nvblaslt.jax runs cuBLASLt on CUDA GPUs only; "
                             f"put the computation on a GPU (jax.devices('gpu'))")


mlir.register_lowering(gemm_p, mlir.lower_fun(_gpu_lowering, multiple_results=True), platform="cuda")
for _platform in ("cpu", "rocm", "tpu"):
    mlir.register_lowering(gemm_p, _refuse_platform, platform=_platform)


def _batch_rule(arrays, dims, *, spec: Spec, capturable: bool):
    """vmap: the mapped axis becomes the leading batch axis of every mapped operand; unmapped operands
    stay single matrices, which nvblaslt broadcasts over the batch (a batched GEMM, one launch)."""
    layouts = [spec.a, spec.b, *(() if spec.c is None else (spec.c,)), *(layout for _, layout in spec.inputs)]
    for key, d in zip(spec.scale_arrays, dims[len(layouts):]):
        if d is not None:
            name = "epilog_inputs['aux_quantization_scale']" if key == "aux" else f"quantization_scales['{key}']"
            raise NvblasltValueError(f"{name}: vmap over a scale is not supported (cuBLASLt reads one scale per "
                                     f"batched GEMM); map the operands and keep the scale unmapped")
    _, old_outputs = outputs_of(spec)
    amax = [o.key for o in old_outputs if o.key.endswith("_amax")]
    if amax:  # cuBLASLt's amax of a batched GEMM is one value over the batch: never one per mapped element
        name = "options.result_amax" if "result_amax" in amax else "preferences.epilog.aux_amax"
        raise NvblasltValueError(f"{name}: vmap of an fp8 GEMM with an amax is not supported (a batched GEMM has one "
                                 f"amax over the whole batch, not one per mapped element); give the operands a batch "
                                 f"axis to get that one amax, or call it per element")
    scales = list(arrays[len(layouts):])
    arrays, dims = arrays[:len(layouts)], dims[:len(layouts)]
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
               spec.epilog, spec.alpha, spec.beta, spec.options, spec.preferences, spec.scales, spec.scale_arrays)
    _, new_outputs = outputs_of(new)
    results = []
    for buffer, old, new_output in zip(bind(new, *moved, *scales, capturable=capturable), old_outputs, new_outputs):
        caller = jax.numpy.transpose(buffer, new_output.to_caller)  # (size, …) as the caller's batched array
        old_caller_shape = tuple(old.buffer_shape[axis] for axis in old.to_caller)
        caller = caller.reshape((size, *old_caller_shape))  # a batched bias gradient is (…, M, 1), one is (M,)
        to_buffer = sorted(range(len(old.to_caller)), key=old.to_caller.__getitem__)
        results.append(jax.numpy.transpose(caller, (0, *(1 + axis for axis in to_buffer))))
    return results, [0] * len(results)


batching.primitive_batchers[gemm_p] = _batch_rule


def _refuse_gradient(primals, tangents, *, spec: Spec, capturable: bool):
    """jax.grad reaches the primitive only where ``matmul``'s own gradient does not apply: refused by name."""
    dtypes = (spec.a.dtype, spec.b.dtype)
    if any(dtype in {d.name for d in FLOAT8} for dtype in dtypes):
        raise NvblasltUnsupportedError(f"a, b: jax.grad through nvblaslt.jax.matmul takes real 16-, 32- or 64-bit "
                                       f"operands, got fp8 ({' × '.join(dtypes)}); differentiate the "
                                       f"higher-precision computation the fp8 one quantizes")
    raise NvblasltUnsupportedError(f"epilog: jax.grad through nvblaslt.jax.matmul differentiates DEFAULT, BIAS, RELU* "
                                   f"and GELU* (without fp8 scales); got {spec.epilog.name}")


ad.primitive_jvps[gemm_p] = _refuse_gradient


# ---- the launch, in XLA's callback ----------------------------------------------------------------
def _pointer(buffer) -> int:
    if buffer.dtype.itemsize == 1 and buffer.dtype.kind not in "iub":
        # why: XLA's buffers have no __cuda_array_interface__ for fp8 (no typestr: "Unimplemented primitive type
        # F8E4M3FN" on the GPU, JAX 0.11); their DLPack capsule names the type
        capsule = buffer.__dlpack__()
        tensor = _dlpack.read_capsule(capsule)[0]
        return int(tensor.data or 0) + int(tensor.byte_offset)
    return buffer.__cuda_array_interface__["data"][0]


def _alignment(pointer: int) -> int:
    return min(_ALIGN, pointer & -pointer) if pointer else _ALIGN


class _Entry:
    """One plan for one static GEMM on one GPU and stream, with its output setters prebuilt."""

    def __init__(self, spec: Spec, outputs, pointers: list, stream: int, device: int):
        layouts = [("a", spec.a), ("b", spec.b)] + ([("c", spec.c)] if spec.c is not None else [])
        ops = {name: layout.operand(name, pointer, device) for (name, layout), pointer in zip(layouts, pointers)}
        inputs: dict[str, object] = {key: layout.operand(f"epilog_inputs['{key}']", pointer, device)
                                     for (key, layout), pointer in zip(spec.inputs, pointers[len(layouts):])}
        scales, aux_scale = spec.plan_scales()
        self.plan = Matmul._from_operands(ops["a"], ops["b"], ops.get("c"), stream=stream,
                                          options=spec.matmul_options(), alpha=spec.alpha, beta=spec.beta,
                                          quantization_scales=scales)
        if aux_scale is not None:
            inputs["aux_quantization_scale"] = aux_scale
        self.plan.plan(epilog=spec.epilog, epilog_inputs=inputs or None, preferences=spec.plan_preferences())
        # the scales given as arrays: read from XLA's buffers, their pointers set before each launch
        self.scale_setters = [self.plan._launch.pointer_setter(attribute) for attribute in scale_attributes(spec)]
        self.scale_pointers: list = [None] * len(self.scale_setters)
        self._point_scales(pointers[len(pointers) - len(self.scale_setters):])  # for autotune's trial launches too
        tuning = _tuning.active()
        self.generation = tuning.generation if tuning is not None else 0
        if tuning is not None:  # timed into scratch memory on XLA's stream: XLA's buffers are left as they are
            self.plan.autotune(iterations=tuning.iterations, search=tuning.search, stream=stream)
        self.plan._use_fused_form()  # a searched two-call form allocates its outputs: run the fused one
        self.device = device
        self.captured = False  # a command buffer replays it: it is never freed
        self.names = tuple(key for key, _ in spec.inputs)
        self.has_c = spec.c is not None
        self.alpha, self.beta = spec.alpha, (0.0 if spec.beta is None else spec.beta)
        self.setters = [self.plan._launch.pointer_setter(o.attribute) for o in outputs[1:]]
        self.sizes = [int(np.prod(o.buffer_shape)) * np.dtype(jax.numpy.dtype(o.dtype)).itemsize for o in outputs]
        # the alignment each output needs: an amax is one float (cuBLASLt reads 16 bytes' alignment there)
        self.alignments = [_AMAX_ALIGN if o.key.endswith("amax") else _ALIGN for o in outputs]
        self.scratch: list = [None] * len(outputs)  # for an output XLA placed below its alignment

    def _point_scales(self, scale_pointers) -> None:
        for index, (set_pointer, pointer) in enumerate(zip(self.scale_setters, scale_pointers)):
            if pointer != self.scale_pointers[index]:
                set_pointer(pointer)
                self.scale_pointers[index] = pointer

    def run(self, pointers: list, out_pointers: list, stream: int) -> None:
        if self.scale_setters:
            self._point_scales(pointers[len(pointers) - len(self.scale_setters):])
            pointers = pointers[:len(pointers) - len(self.scale_setters)]
        given = pointers if self.has_c else [pointers[0], pointers[1], None, *pointers[2:]]
        self.plan._rebind(given, self.names, self.alpha, self.beta)
        targets = [p if _alignment(p) >= need else self._scratch(i, stream)
                   for i, (p, need) in enumerate(zip(out_pointers, self.alignments))]
        for set_pointer, target in zip(self.setters, targets[1:]):
            set_pointer(target)
        self.plan._launch.run(targets[0], stream)
        for index, (target, pointer) in enumerate(zip(targets, out_pointers)):
            if target != pointer:
                _scratch_copies[0] += 1
                _cuda.check(_cuda.cudart.cudaMemcpyAsync(pointer, target, self.sizes[index],
                                                         _cuda.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
                                                         stream), "cudaMemcpyAsync")

    def keep(self) -> bool:
        """Mark the plan as one a command buffer replays (never freed); True the first time."""
        first, self.captured = not self.captured, True
        return first

    def free(self) -> None:
        if self.captured:
            return
        self.plan.free()
        for buffer in self.scratch:
            if buffer is not None:
                buffer.release()

    def _scratch(self, index: int, stream: int) -> int:
        if self.scratch[index] is None:
            if _cuda.is_capturing(stream):
                raise NvblasltValueError("out: XLA placed a result below 256-byte alignment while recording a command "
                                         "buffer, and its scratch memory cannot be allocated under capture; trace "
                                         "the program outside nvblaslt.jax.command_buffers()")
            self.scratch[index] = _memory.DeviceBuffer(self.sizes[index], stream)
        return self.scratch[index].pointer


def device_of(stream: int, pointer: int) -> int:
    """The GPU XLA runs this stream on: where its buffers live (read once per stream)."""
    device = _stream_devices.get(stream)
    if device is None:
        attributes = _cuda.check(_cuda.cudart.cudaPointerGetAttributes(pointer), "cudaPointerGetAttributes")
        device = _stream_devices[stream] = int(attributes.device)
    return device


def _launch(spec: Spec, outputs, ctx, outs, *ins) -> None:
    """XLA's callback: the plan for this spec, GPU, stream and alignments (made on the first run), launched."""
    stream = int(ctx.stream)
    pointers = [_pointer(b) for b in ins]
    out_pointers = [_pointer(b) for b in (outs if isinstance(outs, (tuple, list)) else (outs,))]
    device = device_of(stream, out_pointers[0])
    _tuning.count_entry(device)
    scales = len(spec.scale_arrays)
    if _cuda.several_devices() and _cuda.current_device() != device:
        with _cuda.on_device(device):  # the plan's handle and workspace, and the launch, belong to that GPU
            _run(spec, outputs, device, stream, pointers, out_pointers, scales)
        return
    _run(spec, outputs, device, stream, pointers, out_pointers, scales)


def _run(spec: Spec, outputs, device: int, stream: int, pointers: list, out_pointers: list, scales: int = 0) -> None:
    """Launch ``spec``'s plan for this GPU, stream and the operands' alignments (the last ``scales`` pointers
    are scale arrays', whose alignment no kernel choice depends on: a new one makes no new plan)."""
    alignments = tuple(_alignment(p) for p in pointers[:len(pointers) - scales])
    key = (spec, device, stream, alignments)
    try:
        plans = _local.plans
    except AttributeError:
        plans = _local.plans = {}
    entry = plans.get(key)
    tuning = _tuning.active()
    if entry is None or (tuning is not None and entry.generation != tuning.generation):
        entry = plans[key] = _planned(spec, outputs, device, stream, pointers, alignments, entry)
    entry.run(pointers, out_pointers, stream)


def _planned(spec: Spec, outputs, device: int, stream: int, pointers: list, alignments: tuple, old):
    """A new plan; under a command buffer's capture, where nothing may allocate, the one made before."""
    problem = (spec, device, alignments)
    if _cuda.is_capturing(stream):  # XLA records the call on a stream of its own, after an uncaptured first run
        entry = old or _latest.get(problem)
        if entry is None:
            raise NvblasltValueError("stream: XLA is recording a command buffer with an nvblaslt GEMM that never ran "
                                     "outside one, and planning allocates device memory, which capture forbids; run "
                                     "the program once before its command buffer is recorded (XLA's warm-up run "
                                     "does), or trace it outside nvblaslt.jax.command_buffers()")
        if entry.keep():
            _captured.append(entry)
        return entry
    if old is not None:
        old.free()  # made before this autotune() context: made again, and timed (kept if a replay reads it)
    entry = _latest[problem] = _Entry(spec, outputs, pointers, stream, device)
    return entry


def clear_plans() -> None:
    """Free this thread's bridge plans but those a command buffer captured (``nvblaslt.jax.clear_plans``)."""
    plans = getattr(_local, "plans", {})
    freed = {id(entry) for entry in plans.values() if not entry.captured}
    for entry in plans.values():
        entry.free()
    plans.clear()
    for problem, entry in list(_latest.items()):
        if id(entry) in freed:
            del _latest[problem]


__all__ = ["bind", "clear_plans", "device_of", "gemm_p", "vary_alike"]
