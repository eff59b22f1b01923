"""``Matmul`` and ``matmul``: D = epilog(alpha · A @ B + beta · C) on any GPU array.

The path of one call, top to bottom: read operands (``_operands``), check them and derive
the cuBLASLt layouts (``_problem``), plan once (descriptors, epilog attributes, heuristics,
workspace), then execute with every ctypes argument prebuilt (``Matmul.execute``).
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass


from . import _cuda, _memory, _operands, _search, _streams
from ._descriptors import Handle, HeuristicResult, MatmulDesc, MatmulPreference, MatrixLayout, heuristics
from ._epilogs import SPECS, as_epilog, gelu_aux_ld, relu_aux_ld_bytes
from ._errors import CublasLtError, NvblasltTypeError, NvblasltValueError
from ._loader import library
from ._split_bgrad import MASKING, SplitBiasGradient
from ._problem import Problem, check_bias, check_gelu_aux, check_out, check_relu_aux, unsupported_hint
from ._streams import stream_handle

DEFAULT_WORKSPACE = 32 << 20  # what cuBLASLt's docs suggest for Hopper
DEFAULT_LIMIT = 8


@dataclass(frozen=True)
class MatmulPlanPreferences:
    """What the heuristics may return. ``limit``: how many algorithms to ask for (autotune times them)."""

    limit: int = DEFAULT_LIMIT
    max_waves_count: float = 0.0
    reduction_scheme_mask: int | None = None
    numerical_impl_mask: int | None = None
    workspace_limit: int = DEFAULT_WORKSPACE


_DEFAULT_PREFERENCES = MatmulPlanPreferences()


def _preferences(value) -> MatmulPlanPreferences:
    if value is None:
        return MatmulPlanPreferences()
    if isinstance(value, MatmulPlanPreferences):
        return value
    if isinstance(value, dict):
        unknown = set(value) - set(MatmulPlanPreferences.__dataclass_fields__)
        if unknown:
            raise NvblasltValueError(f"preferences: unknown keys {sorted(unknown)}; known: "
                                     f"{sorted(MatmulPlanPreferences.__dataclass_fields__)}")
        return MatmulPlanPreferences(**value)
    raise NvblasltTypeError(f"preferences: expected a dict or MatmulPlanPreferences, got {type(value).__name__}")


def _scalar(value, name: str, ctype):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if not (hasattr(value, "__float__") and not hasattr(value, "__len__")):
            raise NvblasltTypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    return ctype(float(value))


class Matmul:
    """A planned matrix multiplication, executed as often as needed.

    ``Matmul(a, b, c=None, *, alpha=1.0, beta=None, compute_type=None, result_type=None,
    quantization_scales=None, stream=None)``, then ``plan(epilog=…, epilog_inputs=…)``,
    optionally ``autotune()``, then ``execute()`` — which returns D, or ``(D, aux)`` for
    epilogs with auxiliary outputs. Operands are any GPU arrays; results are in ``a``'s
    framework. Use as a context manager, or call ``free()``, to release the plan.
    """

    def __init__(self, a, b, c=None, *, alpha=1.0, beta=None, compute_type=None, result_type=None,
                 quantization_scales=None, stream=None):
        self._lib = library()
        kind = _operands.kind_of(a)
        self._stream = stream_handle(stream) if stream is not None else None
        read_stream = self._stream if self._stream is not None else _default_stream(kind)
        ops = [_operands.read(x, name, read_stream) if x is not None else None
               for x, name in ((a, "a"), (b, "b"), (c, "c"))]
        self._setup(*ops, alpha=alpha, beta=beta, compute_type=compute_type, result_type=result_type,
                    quantization_scales=quantization_scales)

    @classmethod
    def _from_operands(cls, a, b, c, *, stream, **options) -> Matmul:
        self = cls.__new__(cls)
        self._lib = library()
        self._stream = stream
        self._setup(a, b, c, **options)
        return self

    def _setup(self, a, b, c, *, alpha, beta, compute_type, result_type, quantization_scales):
        self.problem = Problem(self._lib, a, b, c, compute_type=compute_type, result_type=result_type)
        self._kind = a.kind
        self._device = a.device
        self._several_devices = _cuda.several_devices()
        if self._stream is None:
            self._stream = _default_stream(self._kind, self._device)
        self._scale_ctype = ctypes.c_double if self.problem.scale_type_name == "CUDA_R_64F" else ctypes.c_float
        if beta is not None and c is None:
            raise NvblasltValueError("beta: given without c; pass c (the matrix beta scales) or drop beta")
        self._alpha = _scalar(alpha, "alpha", self._scale_ctype)
        self._beta = _scalar(0.0 if c is None else (1.0 if beta is None else beta), "beta", self._scale_ctype)
        self._operands = {"a": a, "b": b, "c": c}
        self._scales = None
        if quantization_scales is not None:
            with _cuda.on_device(self._device):
                self._scales = self.problem.quantization_scales(quantization_scales, self._stream)
        self._planned = False
        self._freed = False
        self._workspace = None
        self._split = None  # a SplitBiasGradient, when autotune found the two-call form faster
        self.algorithms: list[HeuristicResult] = []

    # ---- planning ----------------------------------------------------------------------------
    def plan(self, *, epilog=None, epilog_inputs=None, preferences=None, stream=None) -> list[HeuristicResult]:
        """Build the descriptors for ``epilog`` and ask the heuristics for algorithms (best first)."""
        self._check_alive()
        if stream is not None:
            self._stream = stream_handle(stream)
        lib, problem = self._lib, self.problem
        epilog = as_epilog(epilog)
        if epilog.name not in lib.api.cublasLtEpilogue_t.__members__:
            version = ".".join(map(str, lib.version_tuple))
            raise NvblasltValueError(f"epilog: {epilog.name} is not an epilogue of the loaded cuBLASLt {version}")
        spec = SPECS[epilog]
        inputs = self._read_epilog_inputs(spec, epilog, epilog_inputs)
        prefs = _preferences(preferences)

        desc = MatmulDesc(getattr(lib.api, problem.compute_type_name), getattr(lib.api, problem.scale_type_name),
                          lib=lib)
        desc.set("TRANSA", problem.a.trans)
        desc.set("TRANSB", problem.b.trans)
        desc.set("EPILOGUE", int(epilog))
        if self._scales is not None:
            desc.set("A_SCALE_POINTER", self._scales.pointer)
            desc.set("B_SCALE_POINTER", self._scales.pointer + 256)
        self._configure_epilog(desc, spec, inputs)
        layouts = [self._layout(m) for m in (problem.a, problem.b, problem.c, problem.d)]
        preference = MatmulPreference(max_workspace_bytes=prefs.workspace_limit, lib=lib)
        for name, operand in (("A", self._operands["a"]), ("B", self._operands["b"]),
                              ("C", self._operands["c"])):
            preference.set(f"MIN_ALIGNMENT_{name}_BYTES", operand.alignment if operand is not None else 256)
        preference.set("MIN_ALIGNMENT_D_BYTES", 256)
        if prefs.max_waves_count:
            preference.set("MAX_WAVES_COUNT", prefs.max_waves_count)
        if prefs.reduction_scheme_mask is not None:
            preference.set("REDUCTION_SCHEME_MASK", prefs.reduction_scheme_mask)
        if prefs.numerical_impl_mask is not None:
            preference.set("IMPL_MASK", prefs.numerical_impl_mask)

        handle = Handle.for_device(self._device)
        try:
            algorithms = heuristics(handle, desc, *layouts, preference, count=max(1, prefs.limit))
        except CublasLtError as error:
            if error.status_name != "CUBLAS_STATUS_NOT_SUPPORTED":
                raise
            algorithms = []
        if not algorithms:
            status = int(lib.api.CUBLAS_STATUS_NOT_SUPPORTED)
            raise CublasLtError("cublasLtMatmulAlgoGetHeuristic", status, lib.status_name(status),
                                lib.status_string(status), unsupported_hint(problem, epilog))
        self._release_plan()
        self._handle, self._desc, self._layouts, self._preference = handle, desc, layouts, preference
        self.epilog, self._spec, self._epilog_inputs = epilog, spec, inputs
        self.algorithms = algorithms
        self._workspace_limit = prefs.workspace_limit
        tuned, remembered = _search.recall(self)  # what an earlier autotune(search=True) found
        if tuned is not None:
            algorithms.insert(0, tuned)
        workspace = max(r.workspace_size for r in algorithms)
        with _cuda.on_device(self._device):
            self._workspace = _memory.DeviceBuffer(workspace, 0) if workspace else None
        self._prepare_outputs()
        self._input_setters = {key: self._pointer_setter("BIAS_POINTER" if key == "bias" else "EPILOGUE_AUX_POINTER")
                               for key in inputs}
        self._select(algorithms[0])
        self._planned = True
        if remembered.get("bias_gradient_form") == "split" and epilog in MASKING:
            self._split = SplitBiasGradient(self, iterations=0)  # its masking plan recalls its own choice
        return algorithms

    def _prepare_outputs(self) -> None:
        """Everything execute() needs to make its outputs, built once."""
        problem, spec, kind, device = self.problem, self._spec, self._kind, self._device
        self._framework_stream = _streams.current_stream_getter(kind, device)
        self._alloc_d = _memory.allocator(kind, problem.batch, problem.m, problem.n, problem.m, problem.d.dtype,
                                          device)
        self._alloc_aux = []  # (key, allocator, pointer setter)
        if spec.aux_output:
            relu = spec.aux_output == "relu_aux"
            ld = relu_aux_ld_bytes(problem.m) if relu else gelu_aux_ld(problem.m)
            dtype = problem.relu_aux_dtype if relu else problem.d.dtype
            allocate = _memory.allocator(kind, problem.batch, ld, problem.n, ld, dtype, device)
            self._alloc_aux.append((spec.aux_output, allocate, self._pointer_setter("EPILOGUE_AUX_POINTER")))
        if spec.bias_output:
            length = self._bias_output_length(spec)
            allocate = _memory.vector_allocator(kind, problem.batch, length, problem.bias_output_dtype, device)
            self._alloc_aux.append((spec.bias_output, allocate, self._pointer_setter("BIAS_POINTER")))
        self._last_out = None

    def _pointer_setter(self, attribute: str):
        """set(pointer) for one pointer attribute of the plan's MatmulDesc, its ctypes call prebuilt."""
        lib = self._lib
        member = lib.api.cublasLtMatmulDescAttributes_t[attribute]
        setter, handle, value = lib.cublasLtMatmulDescSetAttribute, ctypes.c_void_p(self._desc.handle), ctypes.c_void_p()
        reference, size = ctypes.byref(value), ctypes.sizeof(value)

        def set_pointer(pointer: int) -> None:
            value.value = pointer
            setter(handle, member, reference, size)
        return set_pointer

    def _layout(self, matrix) -> MatrixLayout:
        return MatrixLayout(getattr(self._lib.api, matrix.dtype.cuda), matrix.rows, matrix.cols, matrix.ld,
                            batch_count=self.problem.batch_count, batch_stride=matrix.batch_stride, lib=self._lib)

    def _read_epilog_inputs(self, spec, epilog, epilog_inputs) -> dict:
        if not isinstance(epilog_inputs, (dict, type(None))):
            raise NvblasltTypeError(f"epilog_inputs: expected a dict, got {type(epilog_inputs).__name__}")
        given = dict(epilog_inputs or {})
        missing = [k for k in spec.inputs if k not in given]
        unknown = [k for k in given if k not in spec.inputs]
        if missing or unknown:
            raise NvblasltValueError(
                f"epilog_inputs: {epilog.name} takes {list(spec.inputs) or 'no inputs'}"
                + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else "")
            )
        if spec.aux_input and self.problem.k == 1:
            raise NvblasltValueError(f"a, b: {epilog.name} with K=1 is refused (cuBLASLt reads out of bounds "
                                     f"there); got K=1")
        inputs = {}
        for key in spec.inputs:
            value = given[key]
            inputs[key] = value if isinstance(value, _operands.Operand) else _operands.read(
                value, f"epilog_inputs['{key}']", self._stream)
        self._check_epilog_inputs(inputs)
        return inputs

    def _check_epilog_inputs(self, inputs: dict) -> None:
        problem = self.problem
        for key, op in inputs.items():
            if op.device != self._device:
                raise NvblasltValueError(f"epilog_inputs['{key}']: on GPU {op.device}, but the operands are on "
                                         f"GPU {self._device}")
            if key == "bias":
                check_bias(op, problem)
            elif key == "relu_aux":
                check_relu_aux(op, problem)
            else:
                check_gelu_aux(op, problem)

    def _configure_epilog(self, desc: MatmulDesc, spec, inputs: dict) -> None:
        problem, api = self.problem, self._lib.api
        batched = problem.batch_count > 1
        if spec.bias_input:
            bias = inputs["bias"]
            desc.set("BIAS_POINTER", bias.ptr)
            desc.set("BIAS_DATA_TYPE", int(getattr(api, bias.dtype.cuda)))
            if batched:
                desc.set("BIAS_BATCH_STRIDE", bias.strides[0] if len(bias.shape) == 2 else 0)
        if spec.bias_output:
            desc.set("BIAS_DATA_TYPE", int(getattr(api, problem.bias_output_dtype.cuda)))
            if batched:
                desc.set("BIAS_BATCH_STRIDE", self._bias_output_length(spec))
        aux = spec.aux_input or spec.aux_output
        if aux == "relu_aux":
            ld_bytes = inputs["relu_aux"].strides[-1] if spec.aux_input else relu_aux_ld_bytes(problem.m)
            desc.set("EPILOGUE_AUX_LD", ld_bytes * 8)
            if batched:
                desc.set("EPILOGUE_AUX_BATCH_STRIDE", ld_bytes * 8 * problem.n)
        elif aux == "gelu_aux":
            ld = inputs["gelu_aux"].strides[-1] if spec.aux_input else gelu_aux_ld(problem.m)
            desc.set("EPILOGUE_AUX_LD", ld)
            if batched:
                desc.set("EPILOGUE_AUX_BATCH_STRIDE", ld * problem.n)
        if spec.aux_input:
            desc.set("EPILOGUE_AUX_POINTER", inputs[spec.aux_input].ptr)

    def _bias_output_length(self, spec) -> int:
        return self.problem.m if spec.bias_output_length == "m" else self.problem.n

    def _select(self, result: HeuristicResult) -> None:
        """Prebuild every ctypes argument of cublasLtMatmul that does not change per call."""
        self.algorithm = result
        self._algo = result.algorithm.algo
        ws = self._workspace
        self._workspace_pointer = ctypes.c_void_p(ws.pointer if ws and result.workspace_size else None)
        self._workspace_size = ctypes.c_size_t(ws.size if ws and result.workspace_size else 0)
        self._rebuild_arguments()

    def _rebuild_arguments(self) -> None:
        a, b, c = (self._operands[k] for k in "abc")
        layouts = self._layouts
        self._matmul = self._lib.cublasLtMatmul
        # A, B and C pointers are mutable ctypes objects: new operands update them in place.
        self._a_pointer, self._b_pointer = ctypes.c_void_p(a.ptr), ctypes.c_void_p(b.ptr)
        self._args_head = (ctypes.c_void_p(self._handle.handle), ctypes.c_void_p(self._desc.handle),
                           ctypes.byref(self._alpha), self._a_pointer, ctypes.c_void_p(layouts[0].handle),
                           self._b_pointer, ctypes.c_void_p(layouts[1].handle), ctypes.byref(self._beta))
        self._c_pointer = ctypes.c_void_p(c.ptr) if c is not None else None
        self._c_layout = ctypes.c_void_p(layouts[2].handle)
        self._d_layout = ctypes.c_void_p(layouts[3].handle)
        self._args_tail = (ctypes.byref(self._algo), self._workspace_pointer, self._workspace_size)

    # ---- autotuning ----------------------------------------------------------------------------
    def autotune(self, *, iterations: int = 5, search: bool = False, remember: bool = True,
                 stream=None) -> list[tuple[HeuristicResult, float]]:
        """Time the planned algorithms (median of ``iterations``, L2 flushed before each run) and
        keep the fastest. Returns ``[(algorithm, milliseconds)]``, fastest first.

        ``search=True`` also times configurations the heuristics do not return (every algorithm
        id, tile and stage count ``cublasLtMatmulAlgoCheck`` accepts for this plan), and with
        ``remember`` the winner is stored on disk (``NVBLASLT_CACHE_DIR``, default
        ``~/.cache/nvblaslt``) so later plans of the same problem start from it."""
        self._check_planned()
        with _cuda.on_device(self._device):
            return self._autotune(iterations, search, remember, stream)

    def _autotune(self, iterations, search, remember, stream):
        from ._autotune import time_algorithms

        stream_h = stream_handle(stream) if stream is not None else self._stream
        candidates = list(self.algorithms)
        if search:
            candidates += _search.configurations(self, workspace_limit=self._workspace_limit)
            needed = max(r.workspace_size for r in candidates)
            if needed > (self._workspace.size if self._workspace else 0):
                if self._workspace is not None:
                    self._workspace.release()
                self._workspace = _memory.DeviceBuffer(needed, 0)
            # Screen the newcomers with one run each; then time the best few together with the whole
            # heuristic list properly, so a noisy screen can never leave the search worse than autotune.
            newcomers = candidates[len(self.algorithms):]
            screened = time_algorithms(self, newcomers, stream_h, 1) if newcomers else []
            finalists = list(self.algorithms) + [r for r, _ in screened[:8]]
            timings = time_algorithms(self, finalists, stream_h, max(iterations, 3)) + screened[8:]
        else:
            timings = time_algorithms(self, candidates, stream_h, iterations)
        self._select(timings[0][0])
        if search and self.epilog in MASKING:
            self._choose_bias_gradient_form(stream_h, iterations, remember)
        if search and remember:
            form = getattr(self, "bias_gradient_form", None)
            _search.remember(self, *timings[0], **({"bias_gradient_form": form[0]} if form else {}))
        return timings

    def _choose_bias_gradient_form(self, stream_h: int, iterations: int, remember: bool) -> None:
        """Time fused *_BGRAD against masking epilog + row-sum GEMV; keep the faster."""
        from ._autotune import time_calls

        if self._split is not None:
            self._split.free()
            self._split = None
        split = SplitBiasGradient(self, iterations)
        fused_ms, split_ms = time_calls(self._device, [lambda: self._run(stream_h, stream_h, None),
                                                       lambda: split.run(stream_h, stream_h, None)],
                                        stream_h, iterations)
        self.bias_gradient_form = ("split", split_ms, fused_ms) if split_ms < fused_ms else ("fused", fused_ms,
                                                                                             split_ms)
        if split_ms < fused_ms:
            self._split = split
            if remember:  # so that a later plan of this problem rebuilds the split form without timing
                _search.remember(split.masked, split.masked.algorithm, split_ms)
        else:
            split.free()

    # ---- execution -----------------------------------------------------------------------------
    def execute(self, *, stream=None, out=None, algorithm: HeuristicResult | None = None):
        """Run the planned multiplication. Returns D, or ``(D, aux)`` when the epilog has auxiliary
        outputs (``relu_aux``, ``gelu_aux``, ``drelu_bgrad``, ``dgelu_bgrad``, ``bgrada``, ``bgradb``)."""
        if not self._planned:
            self._check_planned()
        if self._several_devices and _cuda.current_device() != self._device:
            with _cuda.on_device(self._device):  # cuBLASLt and our allocations act on the current device
                return self.execute(stream=stream, out=out, algorithm=algorithm)
        stream_h = self._stream if stream is None else stream_handle(stream)
        if algorithm is not None:
            self._select(algorithm)
        return self._run(stream_h, self._framework_stream(), out)

    def _run(self, stream_h: int, framework_stream: int, out):
        """Make the outputs and call cublasLtMatmul on ``stream_h``: the hot path, no checks left."""
        if self._split is not None:
            return self._split.run(stream_h, framework_stream, out)
        if out is None:
            d, d_pointer = self._alloc_d(stream_h, framework_stream)
        else:
            d, d_pointer = out, self._out_pointer(out, stream_h)
        self._last_d_pointer = d_pointer
        aux = None
        if self._alloc_aux:
            aux = {}
            for key, allocate, set_pointer in self._alloc_aux:
                array, pointer = allocate(stream_h, framework_stream)
                set_pointer(pointer)
                aux[key] = array
        c_pointer = self._c_pointer if self._c_pointer is not None else d_pointer
        self._matmul(*self._args_head, c_pointer, self._c_layout, d_pointer, self._d_layout, *self._args_tail,
                     stream_h)
        kind = self._kind
        if out is None and kind not in ("cupy", "torch"):
            d = _memory.to_framework(kind, d)
        if aux is None:
            return d
        if kind not in ("cupy", "torch"):
            aux = {k: _memory.to_framework(kind, v) for k, v in aux.items()}
        return d, aux

    def _out_pointer(self, out, stream_h: int) -> int:
        """Check ``out=`` once per array: the same object with the same fingerprint is not re-read."""
        last = self._last_out
        if last is not None and last[0]() is out and last[1] == _operands.fingerprint(out, self._kind):
            return last[2]
        d_op = _operands.read(out, "out", stream_h)
        others = [self._operands["a"], self._operands["b"], *self._epilog_inputs.values()]
        check_out(d_op, self.problem, self._operands["c"], others)
        fingerprint = _operands.fingerprint(out, self._kind)
        if fingerprint is not None:
            self._last_out = (weakref.ref(out), fingerprint, d_op.ptr)
        return d_op.ptr

    # ---- operands ---------------------------------------------------------------------------------
    def reset_operands(self, a=None, b=None, c=None, *, alpha=None, beta=None, epilog_inputs=None, stream=None):
        """Point the plan at new arrays of the same shapes, dtypes, strides, device and alignment."""
        self._check_planned()
        stream_h = self._stream if stream is None else stream_handle(stream)
        for name, new in (("a", a), ("b", b), ("c", c)):
            if new is None:
                continue
            old = self._operands[name]
            if old is None:
                raise NvblasltValueError(f"{name}: the plan was made without {name}; make a new Matmul")
            op = _operands.read(new, name, stream_h)
            _require_same(name, old, op)
            self._operands[name] = op
        if epilog_inputs:
            unknown = [k for k in epilog_inputs if k not in self._epilog_inputs]
            if unknown:
                raise NvblasltValueError(f"epilog_inputs: {self.epilog.name} takes "
                                         f"{list(self._epilog_inputs)}; unknown {unknown}")
            for key, value in epilog_inputs.items():
                op = _operands.read(value, f"epilog_inputs['{key}']", stream_h)
                _require_same(f"epilog_inputs['{key}']", self._epilog_inputs[key], op)
                self._epilog_inputs[key] = op
            self._configure_epilog(self._desc, self._spec, self._epilog_inputs)
        if self._split is not None:
            self._split.reset_operands(a=a, b=b, c=c, alpha=alpha, beta=beta, epilog_inputs=epilog_inputs,
                                       stream=stream)
        if alpha is not None:
            self._alpha.value = _scalar(alpha, "alpha", self._scale_ctype).value
        if beta is not None:
            if self._operands["c"] is None:
                raise NvblasltValueError("beta: the plan has no c for beta to scale")
            self._beta.value = _scalar(beta, "beta", self._scale_ctype).value
        self._rebuild_arguments()

    def _set_pointers(self, a, b, c, inputs: dict, alpha, beta) -> None:
        """Fast rebinding for the cached function form: the cache key already matched every check."""
        operands = self._operands
        operands["a"], operands["b"], operands["c"] = a, b, c
        self._a_pointer.value, self._b_pointer.value = a.ptr, b.ptr
        if c is not None:
            self._c_pointer.value = c.ptr
        for key, op in inputs.items():
            if op.ptr != self._epilog_inputs[key].ptr:
                self._input_setters[key](op.ptr)
            self._epilog_inputs[key] = op
        self._alpha.value = alpha
        self._beta.value = beta

    def _rebind(self, pointers: list, input_names: tuple, alpha: float, beta: float) -> None:
        """The function form's fast path: new pointers for a, b, c, then the named epilog inputs."""
        self._a_pointer.value, self._b_pointer.value = pointers[0], pointers[1]
        if pointers[2] is not None:
            self._c_pointer.value = pointers[2]
        for key, pointer in zip(input_names, pointers[3:]):
            op = self._epilog_inputs[key]
            if pointer != op.ptr:
                self._input_setters[key](pointer)
                op.ptr = pointer
        self._alpha.value = alpha
        self._beta.value = beta

    def _forget_arrays(self) -> None:
        """Drop references to the caller's arrays (pointers and layouts stay)."""
        for op in (*self._operands.values(), *self._epilog_inputs.values()):
            if op is not None:
                op.obj = None

    # ---- lifetime --------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._freed:
            raise NvblasltValueError("this Matmul was freed; make a new one")

    def _check_planned(self) -> None:
        self._check_alive()
        if not self._planned:
            raise NvblasltValueError("execute/autotune/reset_operands: call plan() first")

    def _release_plan(self) -> None:
        for owned in (getattr(self, "_desc", None), getattr(self, "_preference", None),
                      *getattr(self, "_layouts", ())):
            if owned is not None:
                owned.close()
        if self._workspace is not None:
            self._workspace.release()
            self._workspace = None

    def free(self) -> None:
        """Release descriptors and workspace now; the object cannot be used afterwards."""
        if not self._freed:
            if self._split is not None:
                self._split.free()
                self._split = None
            self._release_plan()
            if self._scales is not None:
                self._scales.release()
            self._planned = False
            self._freed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._freed else (self.epilog.name if self._planned else "not planned")
        return f"<Matmul {self.problem.describe()} {state}>"


def _default_stream(kind: str, device: int | None = None) -> int:
    if kind in ("cupy", "torch"):
        return _streams.current_stream(kind, device if device is not None else _cuda.current_device())
    return 0


def _require_same(name: str, old, new) -> None:
    for what in ("shape", "strides", "dtype", "device"):
        if getattr(old, what) != getattr(new, what):
            raise NvblasltValueError(f"{name}: the plan was made for {what} {getattr(old, what)}, got "
                                     f"{getattr(new, what)}; make a new Matmul for a different problem")
    if new.alignment < old.alignment:
        raise NvblasltValueError(f"{name}: pointer 0x{new.ptr:x} is aligned to {new.alignment} bytes, but the "
                                 f"plan's algorithms assume {old.alignment}; make a new Matmul")


# ---- the function form, with a per-thread cache of plans ------------------------------------------
_CACHE_SIZE = 64
_local = threading.local()


def _signature(op) -> tuple | None:
    return None if op is None else (op.shape, op.strides, op.dtype, op.device, op.alignment)


def _fast_lookup(kind, cache, a, b, c, inputs, settings):
    """(plan, pointers) for CuPy/PyTorch operands whose fingerprints match a cached plan, else None.

    A fingerprint is the array's pointer, shape, strides, dtype and device, read without a DLPack
    export; the plan was checked when the same fingerprints (pointers aside) were first seen."""
    fingerprint, array_type = _operands.fingerprint, type(a)
    arrays = (a, b, c, *inputs.values()) if inputs else (a, b, c)
    prints, layout = [], []
    for array in arrays:
        if array is None:
            prints.append(None)
            layout.append(None)
            continue
        if type(array) is not array_type:
            return None
        p = fingerprint(array, kind)
        prints.append(p[0])
        pointer = p[0]
        layout.append((p[1], p[2], p[3], p[4], min(256, pointer & -pointer) if pointer else 256))
    names = tuple(inputs) if inputs else ()
    key = (kind, settings, names, tuple(layout))
    try:
        plan = cache.get(key)
    except TypeError:  # an unhashable setting: the checked path will say what is wrong with it
        return None
    return key, plan, names, prints


def matmul(a, b, c=None, *, alpha=1.0, beta=None, epilog=None, epilog_inputs=None, out=None, compute_type=None,
           result_type=None, quantization_scales=None, preferences=None, stream=None):
    """D = epilog(alpha · a @ b + beta · c) in one call; returns D or ``(D, aux)``.

    Plans are cached per thread, keyed on shapes, strides, dtypes, alignment, device and
    epilog, so repeated calls with like operands do not re-plan. See ``Matmul`` for the
    arguments; ``a`` is (…, M, K), ``b`` is (…, K, N), ``c`` and the result (…, M, N)."""
    kind = _operands.kind_of(a)
    try:
        cache = _local.plans
    except AttributeError:
        cache = _local.plans = OrderedDict()
    if epilog_inputs is not None and not isinstance(epilog_inputs, dict):
        raise NvblasltTypeError(f"epilog_inputs: expected a dict, got {type(epilog_inputs).__name__}")
    prefs = _DEFAULT_PREFERENCES if preferences is None else _preferences(preferences)
    settings = (epilog, compute_type, result_type, beta is None, prefs)
    fast_key = None
    # Fast path: on the framework's own stream (no handshake due), without out= or scales.
    if stream is None and out is None and quantization_scales is None and kind in ("torch", "cupy"):
        found = _fast_lookup(kind, cache, a, b, c, epilog_inputs, settings)
        if found is not None:
            fast_key, plan, names, pointers = found
            if plan is not None:
                cache.move_to_end(fast_key)
                alpha = alpha if type(alpha) is float else _scalar(alpha, "alpha", float)
                plan._rebind(pointers, names, alpha,
                             0.0 if c is None else (1.0 if beta is None else _scalar(beta, "beta", float)))
                if plan._several_devices and _cuda.current_device() != plan._device:
                    with _cuda.on_device(plan._device):
                        return plan._run(*(_streams.framework_stream_of(kind, a),) * 2, None)
                # the framework's current stream now, not the one the plan was made on
                framework_stream = _streams.framework_stream_of(kind, a)
                return plan._run(framework_stream, framework_stream, None)

    framework_stream = _streams.framework_stream_of(kind, a)
    stream_h = stream_handle(stream) if stream is not None else framework_stream
    # On the framework's own stream no handshake is needed, so arrays seen before are not re-exported.
    read = _operands.read_cached if stream_h == framework_stream else _operands.read
    a_op = read(a, "a", stream_h)
    b_op = read(b, "b", stream_h)
    c_op = read(c, "c", stream_h) if c is not None else None
    epilog = as_epilog(epilog)
    inputs = {k: read(v, f"epilog_inputs['{k}']", stream_h) for k, v in (epilog_inputs or {}).items()}
    key = (a_op.kind, epilog, _signature(a_op), _signature(b_op), _signature(c_op),
           tuple((k, _signature(v)) for k, v in sorted(inputs.items())),
           compute_type, result_type, quantization_scales is not None, beta is None, prefs)
    plan = cache.get(key)
    if plan is None or quantization_scales is not None:
        plan = Matmul._from_operands(a_op, b_op, c_op, stream=stream_h, alpha=alpha, beta=beta,
                                     compute_type=compute_type, result_type=result_type,
                                     quantization_scales=quantization_scales)
        plan.plan(epilog=epilog, epilog_inputs=epilog_inputs, preferences=prefs)
        if quantization_scales is None:
            _remember(cache, key, plan)
    else:
        cache.move_to_end(key)
        plan._set_pointers(a_op, b_op, c_op, inputs, _scalar(alpha, "alpha", float),
                           0.0 if c_op is None else (1.0 if beta is None else _scalar(beta, "beta", float)))
    if fast_key is not None and quantization_scales is None and stream_h == framework_stream:
        _remember(cache, fast_key, plan)
    result = plan.execute(stream=stream_h, out=out)
    plan._forget_arrays()  # a cached plan must not keep the caller's arrays alive
    return result


def _remember(cache: OrderedDict, key, plan: Matmul) -> None:
    cache[key] = plan
    while len(cache) > 2 * _CACHE_SIZE:  # a plan may sit under a slow key and a fast key
        evicted = cache.popitem(last=False)[1]
        if evicted not in cache.values():
            evicted.free()


def clear_plan_cache() -> None:
    """Free this thread's cached plans (the function form's)."""
    cache = getattr(_local, "plans", None)
    while cache:
        cache.popitem()[1].free()
