"""``Matmul``: D = epilog(alpha · A @ B + beta · C), planned once, executed many times.

The path of one call: read the operands (``_operands``; host ones staged by ``_host``),
normalize them into one canonical cuBLASLt problem (``_problem``), check the epilog's inputs
and shape its outputs (``_epilogs``), build descriptors and ask the heuristics (``plan``),
then ``execute`` with every ctypes argument prebuilt. Beside that path: alpha, beta and the fp8
scales (``_scales``), ``out=`` (``_outputs``), results copied back to the host (``_host``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import threading
import warnings

from cuda.bindings import runtime as cudart

from . import _cuda, _dtypes, _host, _memory, _operands, _streams
from ._descriptors import Handle, HeuristicResult, MatmulDesc, MatmulPreference, MatrixLayout, heuristics
from ._epilogs import SPECS, as_epilog, check_aux, check_bias, outputs
from ._errors import CublasLtError, NvblasltTypeError, NvblasltValueError
from ._loader import library
from ._options import MatmulOptions, MatmulPlanPreferences, as_options, conjugate_flags, memory_limit_bytes
from ._outputs import OutputChecker
from ._problem import COL, OP_N, OP_T, Operands, canonical
from ._scales import Scalar, Scales
from ._streams import stream_handle

logger = logging.getLogger("nvblaslt")
_NUMBERS = (float, int)  # alpha/beta types the function form's rebinding compares without re-checking
_UNSET_OUTPUT = 256  # an output pointer before the first launch: aligned, in the never-mapped first page


class Matmul:
    """A planned matrix multiplication, executed as often as needed (nvmath-python's ``Matmul``).

    ``Matmul(a, b, c=None, *, alpha=None, beta=None, qualifiers=None, quantization_scales=None,
    options=None, stream=None)``, then ``plan(epilog=…, epilog_inputs=…)``, optionally
    ``autotune()``, then ``execute()``, which returns D, or ``(D, aux)`` when the epilog has
    outputs (or ``result_amax`` is set). Operands are GPU arrays of any package (DLPack or
    ``__cuda_array_interface__``) or host arrays (NumPy, CPU torch), staged to the GPU; results
    come back in the operands' package and memory space. ``compute_type`` and ``result_type``
    may also be given directly as keywords. Use as a context manager or call ``free()``."""

    def __init__(self, a, b, /, c=None, *, alpha=None, beta=None, qualifiers=None, quantization_scales=None,
                 options=None, stream=None, compute_type=None, result_type=None):
        options = as_options(MatmulOptions, options, "options")
        if compute_type is not None:
            options.compute_type = compute_type
        if result_type is not None:
            options.result_type = result_type
        self.options = options
        self._logger = options.logger or logger
        self._lib = library()
        for name, x in (("a", a), ("b", b)):
            if x is None:
                raise NvblasltTypeError(f"{name}: expected an array, got None")
        given = [(x, name) for x, name in ((a, "a"), (b, "b"), (c, "c")) if x is not None]
        kinds = {name: _operands.kind_of(x) for x, name in given}
        if len(set(kinds.values())) > 1:
            raise NvblasltTypeError(f"a, b, c: operands must come from one array package, got "
                                    f"{', '.join(f'{n}: {k}' for n, k in kinds.items())}")
        self._kind = kinds["a"]
        self._stream = stream_handle(stream) if stream is not None else None
        if self._stream is not None:
            read_stream = self._stream
        elif _operands.is_host_array(a):
            read_stream = 0  # host operands: no framework stream to ask (nor, on CPU-only builds, one to have)
        else:
            read_stream = _streams.current_stream(self._kind, None)
        ops = [_operands.read(x, name, read_stream) for x, name in given]
        self._setup(ops, c is not None, alpha=alpha, beta=beta, qualifiers=qualifiers,
                    quantization_scales=quantization_scales)

    @classmethod
    def _from_operands(cls, a, b, c, *, stream: int, options: MatmulOptions, alpha=None, beta=None,
                       quantization_scales=None, qualifiers=None) -> Matmul:
        """A Matmul over operands already read (the function form's and the split form's path)."""
        self = cls.__new__(cls)
        self.options = options
        self._logger = options.logger or logger
        self._lib = library()
        self._kind = a.kind
        self._stream = stream
        self._setup([x for x in (a, b, c) if x is not None], c is not None, alpha=alpha, beta=beta,
                    qualifiers=qualifiers, quantization_scales=quantization_scales)
        return self

    def _setup(self, ops, has_c: bool, *, alpha, beta, qualifiers, quantization_scales) -> None:
        self._lock = threading.Lock()
        self._released: set[str] | None = None
        self._planned = False
        self._freed = False
        self._workspace: _memory.DeviceBuffer | None = None
        self._scratch: _memory.DeviceBuffer | None = None  # where trial launches write (see trial_run)
        self._split = None  # a SplitBiasGradient, when autotune found the two-call form faster
        self._staged: dict[str, _memory.DeviceBuffer] = {}
        self._aux_dtype: _dtypes.DType | None = None  # the GELU aux output's dtype (see _fp8_aux)
        self._aux_amax = False
        self.algorithms: list[HeuristicResult] = []
        options = self.options
        hosts = {op.host for op in ops}
        if len(hosts) > 1:
            raise NvblasltTypeError("a, b, c: operands must all be in GPU memory or all in host memory")
        self._host = hosts.pop()
        self._blocking = self._host or options.blocking is True
        self._hand_back = self._kind not in ("cupy", "torch") and not self._host
        if self._host:
            self._device = options.device_id
        else:
            self._device = ops[0].device
            for name, op in zip("abc", ops):
                if op.device != self._device:
                    raise NvblasltValueError(f"{name}: on GPU {op.device}, but a is on GPU {self._device}")
        self._several_devices = _cuda.several_devices()
        if self._stream is None:
            self._stream = _streams.current_stream(self._kind, self._device) if not self._host else 0
        self._last_stream = self._stream
        self._host_operands = {}
        if self._host:
            staged = []
            with _cuda.on_device(self._device):
                for name, op in zip("abc", ops):
                    device_op, buffer = _host.stage(op, self._device, self._stream)
                    self._staged[name], self._host_operands[name] = buffer, op
                    staged.append(device_op)
            ops = staged
        a, b = ops[0], ops[1]
        c = ops[2] if has_c else None
        if c is not None and c.conjugated:
            raise NvblasltValueError("c: a conjugate view cannot be read (cuBLASLt has no conjugate C); call "
                                     ".resolve_conj() first")
        conjugate = conjugate_flags(qualifiers)  # a lazy-conjugate view flips its operand's flag, as in nvmath
        conjugate = (conjugate[0] != a.conjugated, conjugate[1] != b.conjugated)
        self.operands = Operands(self._lib.api, a, b, c, compute_type=options.compute_type,
                                 scale_type=options.scale_type, result_type=options.result_type,
                                 inplace=options.inplace, conjugate=conjugate)
        self._operands = {"a": a, "b": b, "c": c}
        types = self.operands.types
        if has_c and beta is None:
            raise NvblasltValueError("beta: a value for beta must be given with c (as in nvmath-python)")
        if beta is not None and not has_c:
            raise NvblasltValueError("beta: given without c; pass c (the matrix beta scales) or drop beta")
        self._alpha = Scalar(types.scale, "alpha")
        self._alpha.set(1.0 if alpha is None else alpha)
        self._beta = Scalar(types.scale, "beta")
        self._beta.set(0.0 if beta is None else beta)
        if options.result_amax and types.d not in _dtypes.FLOAT8:
            raise NvblasltValueError(f"options.result_amax: only fp8 results have an amax, the result is "
                                     f"{types.d.name}")
        self._scales = Scales(types, self._device, self._host)
        scales = self._scales.check(quantization_scales, self._stream)
        if scales:
            with _cuda.on_device(self._device):
                self._scales.write(scales, self._stream)

    # ---- planning ----------------------------------------------------------------------------------
    def plan(self, *, epilog=None, epilog_inputs=None, preferences=None, algorithms=None,
             stream=None) -> list[HeuristicResult]:
        """Build the descriptors for ``epilog`` and ask the heuristics for algorithms (best first).

        ``epilog_inputs``: ``bias`` ((M,), (M, 1) or batched), ``relu_aux`` / ``gelu_aux`` (as
        the forward epilog returned them). ``preferences``: a dict or ``MatmulPlanPreferences``.
        ``algorithms``: algorithms to use instead of asking the heuristics."""
        self._check_alive()
        if stream is not None:
            self._stream = stream_handle(stream)
        with _cuda.on_device(self._device):
            return self._plan(epilog, epilog_inputs, preferences, algorithms)

    def _plan(self, epilog, epilog_inputs, preferences, algorithms):
        lib = self._lib
        api = lib.api
        epilog = as_epilog(epilog)
        if epilog.name not in api.cublasLtEpilogue_t.__members__:
            version = ".".join(map(str, lib.version_tuple))
            raise NvblasltValueError(f"epilog: {epilog.name} is not an epilogue of the loaded cuBLASLt {version}")
        prefs = as_options(MatmulPlanPreferences, preferences, "preferences")
        problem = self._pending_problem = canonical(self.operands, epilog)
        spec = SPECS[epilog]
        epilog_inputs, aux_dtype, aux_scale = self._fp8_aux(spec, prefs.epilog, epilog_inputs)
        inputs = self._read_epilog_inputs(spec, epilog, epilog_inputs, problem)
        types = problem.types

        desc = MatmulDesc(getattr(api, f"CUBLAS_{types.compute}"), getattr(api, types.scale), lib=lib)
        desc.set("TRANSA", problem.a.op)
        desc.set("TRANSB", problem.b.op)
        desc.set("EPILOGUE", int(problem.epilog))
        if self.options.sm_count_target:
            desc.set("SM_COUNT_TARGET", self.options.sm_count_target)
        if self.options.fast_accumulation and problem.fp8:  # as in nvmath-python: fp8 operands only
            desc.set("FAST_ACCUM", 1)
        for attribute, pointer in self._scales.descriptor_pointers(problem).items():
            desc.set(attribute, pointer)
        self._aux_dtype, self._aux_amax = aux_dtype, bool(prefs.epilog.aux_amax)
        if aux_dtype is not None and (aux_dtype != types.d or types.d in _dtypes.FLOAT8):
            # cuBLASLt's own default with an fp8 D is not the type nvmath-python returns: say it always
            desc.set("EPILOGUE_AUX_DATA_TYPE", int(getattr(api, aux_dtype.cuda)))
        if aux_scale is not None:
            self._scales.write({"aux": aux_scale}, self._stream)
            desc.set("EPILOGUE_AUX_SCALE_POINTER", self._scales.pointer("aux"))
        self._configure_epilog(desc, spec, inputs, problem)
        layouts = [self._layout(problem.a.layout, problem), self._layout(problem.b.layout, problem),
                   self._layout(problem.c or dataclasses.replace(problem.d, dtype=types.c), problem),
                   self._layout(problem.d, problem)]
        workspace_limit = prefs.workspace_limit
        if self.options.memory_limit != "80%":  # the default leaves far more than any workspace
            total = _cuda.device_properties(self._device).totalGlobalMem
            workspace_limit = min(workspace_limit, memory_limit_bytes(self.options.memory_limit, total))
        preference = MatmulPreference(max_workspace_bytes=workspace_limit, lib=lib)
        alignment = {"A": self._operands[problem.a.source].alignment, "B": self._operands[problem.b.source].alignment,
                     "C": self._operands["c"].alignment if self._operands["c"] is not None else 256,
                     "D": self._operands["c"].alignment if problem.inplace else 256}
        for key, value in alignment.items():
            preference.set(f"MIN_ALIGNMENT_{key}_BYTES", value)
        if prefs.max_waves_count:
            preference.set("MAX_WAVES_COUNT", prefs.max_waves_count)
        reduction = prefs.reduction_scheme_mask
        if reduction is None and types.d.itemsize <= 2:
            # Split-K partial sums kept in a 16- or 8-bit result type lose digits (measured on an H200: 31× the
            # error of one rounding in bf16); cuBLASLt's heuristics still pick them first for some shapes.
            reduction = int(api.CUBLASLT_REDUCTION_SCHEME_INPLACE) | int(api.CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
        if reduction is not None:
            preference.set("REDUCTION_SCHEME_MASK", reduction)
        if prefs.numerical_impl_mask is not None:
            preference.set("IMPL_MASK", prefs.numerical_impl_mask)

        given_algos = self._algorithm_structs(algorithms) if algorithms is not None else None
        handle = Handle.for_device(self._device) if self.options.handle is None else _ForeignHandle(self.options.handle)
        if given_algos is not None:
            found = self._given_algorithms(given_algos, handle, desc, layouts)
        else:
            try:
                found = heuristics(handle, desc, *layouts, preference, count=prefs.limit)
            except CublasLtError as error:
                if error.status_name != "CUBLAS_STATUS_NOT_SUPPORTED":
                    raise
                found = []
        offered = len(found)
        found = _guard_known_bad(found, problem)
        if not found:
            status = int(api.CUBLAS_STATUS_NOT_SUPPORTED)
            raise CublasLtError("cublasLtMatmulAlgoGetHeuristic", status, lib.status_name(status),
                                lib.status_string(status), _unsupported_hint(problem, epilog, offered > 0))
        self._planned = False  # until the new plan is whole: execute() must not launch with what is released here
        self._release_plan()
        if self._split is not None:  # the two-call form of the previous plan
            self._split.free()
            self._split = None
        self.problem, self.epilog, self._spec = problem, epilog, spec
        self._handle, self._desc, self._layouts, self._preference = handle, desc, layouts, preference
        self._epilog_inputs = inputs
        self.algorithms = found
        self._workspace_limit = workspace_limit
        if algorithms is None:
            from . import _tuning_cache

            tuned, remembered = _tuning_cache.recall(self)  # what an earlier autotune(search=True) found
            if tuned is not None:
                found.insert(0, tuned)
        else:
            remembered = {}
        self._ensure_workspace(max(r.workspace_size for r in found))
        self._prepare_outputs(spec, problem)
        self._input_setters = {key: self._pointer_setter("BIAS_POINTER" if key == "bias" else "EPILOGUE_AUX_POINTER")
                               for key in inputs}
        self._bind_pointers()
        self._select(found[0])
        self._planned = True
        self._logger.debug("plan %s: %d algorithms, first %s", problem.describe(), len(found), found[0])
        from ._split_bgrad import MASKING, SplitBiasGradient

        if remembered.get("bias_gradient_form") == "split" and epilog in MASKING:
            self._split = SplitBiasGradient(self, iterations=0)  # its masking plan recalls its own choice
        return found

    def _algorithm_structs(self, algorithms) -> list:
        """``cublasLtMatmulAlgo_t`` values from the caller's algorithms (ours, nvmath-python's, or their bytes)."""
        if not isinstance(algorithms, (list, tuple)) or not algorithms:
            raise NvblasltTypeError(f"algorithms: expected a non-empty list of algorithms, got {algorithms!r}")
        struct_type = self._lib.api.cublasLtMatmulAlgo_t
        structs = []
        for index, item in enumerate(algorithms):
            algo = getattr(item, "algorithm", item)
            algo = getattr(algo, "algo", algo)
            if not isinstance(algo, struct_type):
                raw = getattr(item, "algorithm", item)
                try:  # nvmath-python's Algorithm keeps the algorithm's bytes (a NumPy array)
                    data = bytes(memoryview(raw))
                    algo = struct_type.from_buffer_copy(data)
                except (TypeError, ValueError, BufferError):
                    raise NvblasltTypeError(f"algorithms[{index}]: expected an algorithm from plan()/autotune(), got "
                                            f"{type(item).__name__}") from None
            structs.append(algo)
        return structs

    def _fp8_aux(self, spec, epilog_preferences, epilog_inputs):
        """(epilog inputs without the aux scale, the GELU aux output's dtype or None, its scale or None):
        nvmath-python's ``preferences.epilog.aux_type`` / ``aux_amax`` and the
        ``aux_quantization_scale`` epilog input. The GELU aux is stored in D's type, or in C's where D
        is fp8 (as nvmath-python stores it: an fp8 aux needs a scale), unless ``aux_type`` says otherwise."""
        aux_type = epilog_preferences.aux_type
        given = dict(epilog_inputs) if isinstance(epilog_inputs, dict) else epilog_inputs
        scale = given.pop("aux_quantization_scale", None) if isinstance(given, dict) else None
        types = self.operands.types
        aux_dtype = None
        if spec.aux_output == "gelu_aux":
            aux_dtype = types.c if types.d in _dtypes.FLOAT8 else types.d
        if aux_type is not None:
            if spec.aux_output != "gelu_aux":
                raise NvblasltValueError("preferences.epilog.aux_type: only GELU_AUX epilogs take an aux type (the ReLU "
                                         "aux is a bitmask)")
            from ._types import cuda_type_names

            default = aux_dtype
            aux_dtype = _dtypes.parse(aux_type, "preferences.epilog.aux_type", cuda_type_names(self._lib.api))
            allowed = (*_dtypes.FLOAT8, default)
            if aux_dtype not in allowed:
                raise NvblasltTypeError(f"preferences.epilog.aux_type: expected one of "
                                        f"{', '.join(d.name for d in allowed)}, got {aux_dtype.name}")
        narrow = aux_type is not None and aux_dtype in _dtypes.FLOAT8
        if narrow and scale is None:
            raise NvblasltValueError("epilog_inputs['aux_quantization_scale']: required when "
                                     "preferences.epilog.aux_type is an fp8 type")
        if scale is not None and not narrow:
            raise NvblasltValueError("epilog_inputs['aux_quantization_scale']: only an fp8 aux "
                                     "(preferences.epilog.aux_type) takes a scale")
        if epilog_preferences.aux_amax and not narrow:
            raise NvblasltValueError("preferences.epilog.aux_amax: only an fp8 aux (preferences.epilog.aux_type) has "
                                     "an amax")
        if scale is not None:
            scale = self._scales.check_values({"aux": scale}, self._stream,
                                              "epilog_inputs['aux_quantization_scale']")["aux"]
        return given, aux_dtype, scale

    def _given_algorithms(self, structs, handle, desc, layouts) -> list[HeuristicResult]:
        """The caller's algorithms, each checked by cuBLASLt for this plan."""
        from ._search import check_algorithm

        checked = []
        for index, algo in enumerate(structs):
            result = check_algorithm(_PlanView(self._lib, handle, desc, layouts, self._pending_problem), algo)
            if result is None:
                raise NvblasltValueError(f"algorithms[{index}]: cuBLASLt's algorithm check refuses it for this plan")
            checked.append(result)
        return checked

    def _ensure_workspace(self, nbytes: int) -> None:
        """A workspace of at least ``nbytes``. The old one is freed after work queued on it, and only
        once the new one exists: a failed allocation leaves the plan whole, on the old one."""
        if nbytes <= (self._workspace.size if self._workspace is not None else 0):
            return
        old, self._workspace = self._workspace, _memory.DeviceBuffer(nbytes, self._last_stream)
        if self._planned:
            self._select(self.algorithm)  # the launch arguments must not keep the old one's pointer
        if old is not None:
            old.release()

    def _prepare_outputs(self, spec, problem) -> None:
        """Everything execute() needs to make its outputs, built once."""
        kind, device = self._kind, self._device
        alloc_kind = "protocol" if self._host else kind
        self._framework_stream = _streams.current_stream_getter(kind if not self._host else "protocol", device)
        self._alloc_d = None if problem.inplace else _memory.strided_allocator(
            alloc_kind, problem.result_shape, problem.result_strides, problem.types.d, device)
        self._outputs = outputs(spec, problem, _dtypes.UINT8, self._aux_dtype)
        self._alloc_aux = []  # (key, allocator, pointer setter)
        for output in self._outputs:
            allocate = _memory.strided_allocator(alloc_kind, output.shape, output.strides, output.dtype, device)
            self._alloc_aux.append((output.key, allocate, self._pointer_setter(output.attribute)))
        amax = _memory.strided_allocator(alloc_kind, (1,), (1,), _dtypes.FLOAT32, device)
        if self._aux_amax:
            self._alloc_aux.append((f"{spec.aux_output}_amax", amax, self._pointer_setter("EPILOGUE_AUX_AMAX_POINTER")))
        if self.options.result_amax:
            self._alloc_aux.append(("result_amax", amax, self._pointer_setter("AMAX_D_POINTER")))
        self._out_checker = OutputChecker(kind, self._host, problem, device, self._operands, self._epilog_inputs)
        if self._host:  # where execute copies the results back to: (D's layout, each aux output's by key)
            layouts = {o.key: (o.shape, o.strides, o.dtype) for o in self._outputs}
            layouts["result_amax"] = layouts[f"{spec.aux_output}_amax"] = ((1,), (1,), _dtypes.FLOAT32)
            self._host_layouts = ((problem.result_shape, problem.result_strides, problem.types.d), layouts)

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

    def _layout(self, layout, problem) -> MatrixLayout:
        return MatrixLayout(getattr(self._lib.api, layout.dtype.cuda), layout.rows, layout.cols, layout.ld,
                            order=layout.order if layout.order != COL else None,
                            batch_count=problem.batch_count, batch_stride=layout.batch_stride, lib=self._lib)

    def _read_epilog_inputs(self, spec, epilog, epilog_inputs, problem) -> dict:
        if not isinstance(epilog_inputs, (dict, type(None))):
            raise NvblasltTypeError(f"epilog_inputs: expected a dict, got {type(epilog_inputs).__name__}")
        given = dict(epilog_inputs or {})
        missing = [k for k in spec.inputs if k not in given]
        if missing:
            raise NvblasltValueError(f"epilog_inputs: {epilog.name} takes {list(spec.inputs)}; missing {missing}")
        unknown = [k for k in given if k not in spec.inputs]
        if unknown:  # nvmath-python ignores them; say so rather than drop them in silence
            warnings.warn(f"epilog_inputs: {epilog.name} takes {list(spec.inputs) or 'no inputs'}; ignoring "
                          f"{unknown}", stacklevel=4)
        if spec.aux_input and problem.k == 1:
            raise NvblasltValueError(f"a, b: {epilog.name} with K=1 is refused (cuBLASLt reads out of bounds "
                                     f"there); got K=1")
        inputs = {}
        self._input_operands = {}
        for key in spec.inputs:
            name = f"epilog_inputs['{key}']"
            value = given[key]
            op = value if isinstance(value, _operands.Operand) else _operands.read(value, name, self._stream)
            if op.conjugated:
                raise NvblasltValueError(f"{name}: a conjugate view cannot be read as an epilog input; call "
                                         f".resolve_conj() first")
            if op.host != self._host:
                raise NvblasltTypeError(f"{name}: in {'host' if op.host else 'GPU'} memory, but the operands are "
                                        f"in {'host' if self._host else 'GPU'} memory")
            if op.host:
                op, self._staged[key] = _host.stage(op, self._device, self._stream)
            elif op.device != self._device:
                raise NvblasltValueError(f"{name}: on GPU {op.device}, but the operands are on GPU {self._device}")
            inputs[key] = check_bias(op, problem) if key == "bias" else check_aux(op, key, problem)
            self._input_operands[key] = op
        return inputs

    def _configure_epilog(self, desc: MatmulDesc, spec, inputs: dict, problem) -> None:
        api = self._lib.api
        batched = problem.batch_count > 1
        bias = inputs.get("bias")
        if bias is not None:
            desc.set("BIAS_POINTER", bias.ptr)
            desc.set("BIAS_DATA_TYPE", int(getattr(api, bias.dtype.cuda)))
            if batched:
                desc.set("BIAS_BATCH_STRIDE", bias.batch_stride)
        aux = inputs.get(spec.aux_input) if spec.aux_input else None
        if aux is not None:
            desc.set("EPILOGUE_AUX_POINTER", aux.ptr)
            desc.set("EPILOGUE_AUX_LD", aux.ld)
            if batched:
                desc.set("EPILOGUE_AUX_BATCH_STRIDE", aux.batch_stride)
        for output in outputs(spec, problem, _dtypes.UINT8, self._aux_dtype):
            if output.attribute == "BIAS_POINTER":
                desc.set("BIAS_DATA_TYPE", int(getattr(api, output.dtype.cuda)))
                if batched:
                    desc.set("BIAS_BATCH_STRIDE", output.batch_stride)
            else:
                desc.set("EPILOGUE_AUX_LD", output.ld)
                if batched:
                    desc.set("EPILOGUE_AUX_BATCH_STRIDE", output.batch_stride)
        # The outputs' pointers are set at each launch, but cuBLASLt's heuristics read whether they are set
        # (and their alignment): left NULL, an aux epilog with M=1 in 16 bits got one algorithm, which
        # cublasLtMatmul then refused (H200, cuBLASLt 13.1). A placeholder never dereferenced stands in.
        written = {o.attribute for o in outputs(spec, problem, _dtypes.UINT8, self._aux_dtype)}
        if self._aux_amax:
            written.add("EPILOGUE_AUX_AMAX_POINTER")
        if self.options.result_amax:
            written.add("AMAX_D_POINTER")
        for attribute in sorted(written):
            desc.set(attribute, _UNSET_OUTPUT)

    def _select(self, result: HeuristicResult) -> None:
        """Prebuild every ctypes argument of cublasLtMatmul that does not change per call."""
        self.algorithm = result
        self._algo = result.algorithm.algo
        ws = self._workspace
        self._workspace_pointer = ws.pointer if ws and result.workspace_size else None
        self._workspace_size = ws.size if ws and result.workspace_size else 0
        self._rebuild_arguments()

    def _bind_pointers(self) -> None:
        """Point the launch arguments at the current operands. The pointer arguments are mutable
        ctypes objects made once per plan: the hot path and rebuilt argument tuples share them."""
        problem = self.problem
        a, b, c = self._operands[problem.a.source], self._operands[problem.b.source], self._operands["c"]
        if getattr(self, "_a_pointer", None) is None:
            self._a_pointer, self._b_pointer = ctypes.c_void_p(), ctypes.c_void_p()
            self._d_argument, self._stream_argument = ctypes.c_void_p(), ctypes.c_void_p()  # set per call
        self._a_pointer.value, self._b_pointer.value = a.ptr, b.ptr
        self._fast_bound: list | None = None  # the fast path's pointers (default scalars) bound now, if any
        self._swapped = problem.a.source == "b"
        self._c_pointer = ctypes.c_void_p(c.ptr) if c is not None else None

    def _rebuild_arguments(self) -> None:
        problem = self.problem
        layouts = self._layouts
        # No argtypes: every argument is a ctypes object already, so ctypes converts nothing per call
        # (measured on the H200 host: 0.8 to 1.6 µs a call less than with argtypes). The arguments fixed
        # for the plan go as from_param() objects, which ctypes passes as they are; a c_void_p instance
        # is turned into one on every call (0.9 µs a call less over 16 arguments, H200 host).
        self._matmul = _raw_function(self._lib.cublasLtMatmul)
        fixed = ctypes.c_void_p.from_param
        # Without C, cuBLASLt still takes a C pointer; D's own is fine unless C's type differs (fp8 results),
        # where cuBLASLt would take C == D for an in-place call with mismatched descriptors.
        if self._c_pointer is not None:
            c_argument = self._c_pointer
        else:
            c_argument = self._d_argument if problem.types.c == problem.types.d else self._a_pointer
        self._arguments = (fixed(self._handle.handle), fixed(self._desc.handle),
                           self._alpha.reference, self._a_pointer, fixed(layouts[0].handle),
                           self._b_pointer, fixed(layouts[1].handle), self._beta.reference,
                           c_argument, fixed(layouts[2].handle), self._d_argument,
                           fixed(layouts[3].handle), ctypes.byref(self._algo), fixed(self._workspace_pointer),
                           ctypes.c_size_t.from_param(self._workspace_size), self._stream_argument)

    # ---- autotuning --------------------------------------------------------------------------------
    def autotune(self, *, iterations: int = 5, search: bool = False, remember: bool = True,
                 stream=None) -> list[tuple[HeuristicResult, float]]:
        """Time the planned algorithms (median of ``iterations``, L2 flushed before each run) and
        keep the fastest. Returns ``[(algorithm, milliseconds)]``, the selected one first, the rest
        fastest first; sets ``tuning_report`` (and ``bias_gradient_form`` for *_BGRAD searches).

        ``search=True`` also times configurations the heuristics do not return, keeps a
        challenger only when it beats the incumbent beyond the measured noise, and with
        ``remember`` stores the winner on disk (``NVBLASLT_CACHE_DIR``, default
        ``~/.cache/nvblaslt``) so later plans of the same problem start from it."""
        self._check_planned()
        from . import _autotune

        with _cuda.on_device(self._device):
            stream_h = stream_handle(stream) if stream is not None else self._stream
            return _autotune.autotune(self, iterations=iterations, search=search, remember=remember,
                                      stream=stream_h)

    # ---- execution ---------------------------------------------------------------------------------
    def execute(self, *, algorithm: HeuristicResult | None = None, release_workspace: bool = False, stream=None,
                out=None):
        """Run the planned multiplication. Returns D, or ``(D, aux)`` when the epilog has outputs
        (``relu_aux``, ``gelu_aux``, ``drelu_bgrad``, ``dgelu_bgrad``, ``bgrada``, ``bgradb``) or
        ``result_amax`` is set. ``out=`` (nvblaslt): write D into this array (its layout must be
        the one D would have). ``release_workspace``: free the workspace after this call."""
        if not self._planned or self._released:
            self._check_planned()
        if self._several_devices and _cuda.current_device() != self._device:
            with _cuda.on_device(self._device):  # cuBLASLt and our allocations act on the current device
                return self.execute(stream=stream, out=out, algorithm=algorithm, release_workspace=release_workspace)
        stream_h = self._stream if stream is None else stream_handle(stream)
        if algorithm is not None:
            self._select(getattr(algorithm, "_result", algorithm))
        # The framework's stream only matters where its pool allocates (or on the per-thread default
        # stream); asking CuPy for it costs 0.3 µs, a tenth of execute(out=)'s own time.
        if out is None or self._alloc_aux or self._split is not None or stream_h == 2:
            result = self._run(stream_h, self._framework_stream(), out)
        else:
            result = self._run(stream_h, stream_h, out)  # nothing allocated: no pool to tell about the stream
        if self._blocking:  # host operands (copied back, which waits) or options.blocking=True
            if self._host:
                c = self._operands["c"]
                in_place = (self._host_operands["c"], c.ptr, c.strides) if self.problem.inplace else None
                result = _host.to_host(result, self._kind, *self._host_layouts, stream_h, in_place)
            else:
                _cuda.check(cudart.cudaStreamSynchronize(stream_h), "cudaStreamSynchronize")
        if release_workspace and self._workspace is not None:
            self._workspace.release()
            self._workspace = None
            self._planned = False  # the next execute needs plan() again, as in nvmath-python
        return result

    def _run(self, stream_h: int, framework_stream: int, out):
        """Make the outputs and call cublasLtMatmul on ``stream_h``: the hot path, no checks left."""
        with self._lock:  # one launch at a time: the descriptor's output pointers are set per call
            if stream_h != self._last_stream:
                self._order_after_last_stream(stream_h)
            if self._split is not None:
                return self._split.run(stream_h, framework_stream, out)
            if out is not None:
                d, d_pointer = out, self._out_checker.pointer(out, stream_h)
            elif self._alloc_d is None:  # in place: D is C
                d, d_pointer = self._operands["c"].obj, self._operands["c"].ptr
            else:
                d, d_pointer = self._alloc_d(stream_h, framework_stream)
            self._d_argument.value = d_pointer
            self._stream_argument.value = stream_h
            aux = None
            if self._alloc_aux:
                aux = {}
                for key, allocate, set_pointer in self._alloc_aux:
                    array, pointer = allocate(stream_h, framework_stream)
                    set_pointer(pointer)
                    aux[key] = array
            status = self._matmul(*self._arguments)
            if status:
                self._launch_refused(status)
            if stream_h == 2 and framework_stream != 2 and not self._hand_back:
                # results from the framework's pool, used on the per-thread default stream, which the
                # framework cannot be told about: order its stream after ours instead
                _memory._wait(stream_h, framework_stream)
        if self._hand_back:  # nvblaslt's own DeviceArrays, handed to JAX / Numba zero-copy
            kind = self._kind
            if out is None and self._alloc_d is not None:
                d = _memory.to_framework(kind, d)
            if aux is not None:
                aux = {k: _memory.to_framework(kind, v) for k, v in aux.items()}
        return d if aux is None else (d, aux)

    def trial_run(self, stream_h: int) -> int:
        """One launch of the selected algorithm with D and every epilog output in the plan's scratch
        memory, never in the caller's arrays (an in-place c is read, not written): the launches that
        autotune and the search time. Raises on a refusal (no fallback: the caller is choosing).
        Returns the pointer D was written to."""
        with self._lock:
            if stream_h != self._last_stream:
                self._order_after_last_stream(stream_h)
            pointers = self._scratch_pointers(stream_h)
            self._d_argument.value = pointers[0]
            self._stream_argument.value = stream_h
            for (_, _, set_pointer), pointer in zip(self._alloc_aux, pointers[1:]):
                set_pointer(pointer)
            status = self._matmul(*self._arguments)
        if status:
            lib = self._lib
            raise CublasLtError("cublasLtMatmul", status, lib.status_name(status), lib.status_string(status))
        return pointers[0]

    def _scratch_pointers(self, stream_h: int) -> list[int]:
        """D's and each epilog output's place in the scratch buffer (made on first use, 256-byte aligned)."""
        problem = self.problem
        if problem.inplace:  # D is laid out as c
            c = self._operands["c"]
            spans = [_memory.span_elements(c.shape, c.strides) * c.dtype.itemsize]
        else:
            spans = [_memory.span_elements(problem.result_shape, problem.result_strides) * problem.types.d.itemsize]
        spans += [_memory.span_elements(o.shape, o.strides) * o.dtype.itemsize for o in self._outputs]
        spans += [4] * (len(self._alloc_aux) - len(self._outputs))  # amax values: one float32 each
        offsets, total = [], 0
        for span in spans:
            offsets.append(total)
            total += -(-max(span, 1) // 256) * 256
        if self._scratch is None:
            self._scratch = _memory.DeviceBuffer(total, stream_h)
        return [self._scratch.pointer + offset for offset in offsets]

    def _launch_refused(self, status: int) -> None:
        """cublasLtMatmul said no: try the next algorithm where it refused this one (NOT_SUPPORTED,
        seen for aux epilogs with M=1 on an algorithm the heuristics offered), else raise."""
        lib = self._lib
        name = lib.status_name(status)
        while name == "CUBLAS_STATUS_NOT_SUPPORTED" and self._next_algorithm():
            self._logger.info("cublasLtMatmul refused an algorithm for %s; trying %s", self.problem.describe(),
                              self.algorithm)
            status = self._matmul(*self._arguments)  # the same pointer objects: this call's operands
            if not status:
                return
            name = lib.status_name(status)
        raise CublasLtError("cublasLtMatmul", status, name, lib.status_string(status))

    def _next_algorithm(self) -> bool:
        """Drop an algorithm cuBLASLt refused at launch (seen: aux epilogs with M=1); False if none is left."""
        if not any(r is self.algorithm for r in self.algorithms):
            return False  # autotune is timing a candidate of its own: it handles the refusal
        while self.algorithms and self.algorithms[0] is not self.algorithm:
            self.algorithms.pop(0)
        if len(self.algorithms) <= 1:
            return False
        self.algorithms.pop(0)
        self._select(self.algorithms[0])
        return True

    def _order_after_last_stream(self, stream_h: int) -> None:
        """The workspace and descriptor are shared by every stream this plan runs on: order the new
        stream after the work queued on the previous one, then remember it for the release."""
        if _cuda.is_capturing(stream_h):
            return  # a graph capture orders nothing outside itself (torch synchronizes before capturing)
        _memory._wait(self._last_stream, stream_h)
        self._last_stream = stream_h
        for owned in (self._workspace, self._scratch, self._scales.buffer, *self._staged.values()):
            if owned is not None:
                owned.used_on(stream_h)

    # ---- operands ----------------------------------------------------------------------------------
    def reset_operands(self, a=None, b=None, c=None, *, alpha=None, beta=None, epilog_inputs=None,
                       quantization_scales=None, stream=None):
        """Point the plan at new arrays of the same shapes, dtypes, strides, device and alignment
        (nvmath-python's ``reset_operands``); new alpha, beta or fp8 scale values."""
        self._check_alive()
        stream_h = self._stream if stream is None else stream_handle(stream)
        with _cuda.on_device(self._device):
            self._reset(a, b, c, alpha, beta, epilog_inputs, quantization_scales, stream_h)

    def _reset(self, a, b, c, alpha, beta, epilog_inputs, quantization_scales, stream_h):
        # Everything is read and checked first; the plan changes only once nothing can refuse, so a refused
        # reset leaves it pointing at the operands it had.
        released = getattr(self, "_released", None)
        if released:
            missing = sorted(n for n, new in (("a", a), ("b", b), ("c", c)) if n in released and new is None)
            if missing:
                raise NvblasltValueError(f"{', '.join(missing)}: release_operands() dropped the operands; give all "
                                         f"of them again")
        operands = {}
        for name, new in (("a", a), ("b", b), ("c", c)):
            if new is None:
                continue
            old = self._operands[name]
            if old is None:
                raise NvblasltValueError(f"{name}: the plan was made without {name}; make a new Matmul")
            op = _operands.read(new, name, stream_h)
            if _operands.kind_of(new) != self._kind or op.host != self._host:
                raise NvblasltTypeError(f"{name}: expected an array like the original ({self._kind}, "
                                        f"{'host' if self._host else 'GPU'} memory)")
            if op.host:  # copied (conjugated, for a conjugate view) into the device copy's layout: any strides do
                _require_same(name, self._host_operands[name], op, ("shape", "dtype"))
            else:
                _require_same(name, old, op)
            operands[name] = op
        inputs = {}
        if epilog_inputs:
            if not self._planned:
                raise NvblasltValueError("epilog_inputs: call plan() before resetting epilog inputs")
            unknown = [k for k in epilog_inputs if k not in self._epilog_inputs]
            if unknown:
                raise NvblasltValueError(f"epilog_inputs: {self.epilog.name} takes {list(self._epilog_inputs)}; "
                                         f"unknown {unknown}")
            for key, value in epilog_inputs.items():
                name = f"epilog_inputs['{key}']"
                op = _operands.read(value, name, stream_h)
                if op.host:
                    staged = self._input_operands[key]
                    if op.shape != staged.shape or op.dtype != staged.dtype:
                        raise NvblasltValueError(f"{name}: the plan was made for shape {staged.shape} and dtype "
                                                 f"{staged.dtype.name}, got {op.shape} and {op.dtype.name}")
                    inputs[key] = (op, None)
                    continue
                old = self._epilog_inputs[key]
                new = check_bias(op, self.problem) if key == "bias" else check_aux(op, key, self.problem)
                if (new.ld, new.batch_stride, new.dtype) != (old.ld, old.batch_stride, old.dtype):
                    raise NvblasltValueError(f"{name}: the plan was made for another layout or dtype; make a new "
                                             f"plan for it")
                if new.alignment < old.alignment:
                    raise NvblasltValueError(f"{name}: pointer 0x{new.ptr:x} is aligned to {new.alignment} bytes, but "
                                             f"the plan assumed {old.alignment}")
                inputs[key] = (op, new)
        scales = self._scales.check(quantization_scales, self._stream) if quantization_scales is not None else None
        if beta is not None and self._operands["c"] is None:
            raise NvblasltValueError("beta: the plan has no c for beta to scale")
        scale_type = self.operands.types.scale
        for value, argument in ((alpha, "alpha"), (beta, "beta")):
            if value is not None:
                Scalar(scale_type, argument).set(value)  # refuses what the plan's own scalar would
        if self._split is not None:  # its masking plan checks the same things, then takes them
            self._split.reset_operands(a=a, b=b, c=c, alpha=alpha, beta=beta, epilog_inputs=epilog_inputs,
                                       stream=stream_h)

        # Commit. Copies into device memory a queued kernel may still read wait for the last stream's work.
        if self._last_stream != stream_h and not _cuda.is_capturing(stream_h):
            _memory._wait(self._last_stream, stream_h)
        self._released = None
        for name, op in operands.items():
            if op.host:
                old = self._operands[name]
                self._host_operands[name] = op
                _host.refresh(op, old.ptr, old.strides, stream_h)  # into the device copy's layout
                op = _operands.Operand(op.obj, old.ptr, op.shape, old.strides, op.dtype, self._device, op.readonly,
                                       op.kind)
            self._operands[name] = op
        for key, (op, new) in inputs.items():
            if new is None:
                staged = self._input_operands[key]
                _host.refresh(op, staged.ptr, staged.strides, stream_h)  # into the device copy's layout
                continue
            self._epilog_inputs[key] = new
            self._input_operands[key] = op
            self._input_setters[key](new.ptr)
        if scales is not None:
            # new values replace the old for the keys given (numbers or arrays alike); the others stay
            if self._last_stream != self._stream:
                _memory._wait(self._last_stream, self._stream)
            self._scales.write(scales, self._stream)
            if self._planned:
                for attribute, pointer in self._scales.descriptor_pointers(self.problem).items():
                    self._desc.set(attribute, pointer)
        self._fast_bound = None
        if alpha is not None:
            self._alpha.set(alpha)
        if beta is not None:
            self._beta.set(beta)
        if self._planned:
            self._out_checker.forget()  # a new operand may overlap an out= checked before
            self._bind_pointers()
            self._rebuild_arguments()  # C's pointer object may be new

    def release_operands(self) -> None:
        """Drop the references to the operands (nvmath-python's ``release_operands``): the plan
        stays; ``reset_operands`` must give new operands before the next ``execute``."""
        self._check_alive()
        self._forget_arrays()
        self._released = {name for name, op in self._operands.items() if op is not None}

    def _set_operands(self, a, b, c, inputs: dict, alpha, beta) -> None:
        """The function form's checked path on a cache hit: the key already matched every check."""
        self._operands["a"], self._operands["b"], self._operands["c"] = a, b, c
        self._out_checker.forget()  # a new a, b or c may overlap an out= checked before
        if self._split is not None:
            self._split.masked._set_operands(a, b, c, inputs, alpha, beta)
        self._rebind([a.ptr, b.ptr, c.ptr if c is not None else None, *(op.ptr for op in inputs.values())],
                     tuple(inputs), alpha, beta)

    def _rebind(self, pointers: list, input_names: tuple, alpha, beta) -> None:
        """The function form's fast path: new pointers for a, b, c, then the named epilog inputs."""
        self._fast_bound = None  # set again by the fast path once this binding is complete
        if self._swapped:  # the transposed problem: cuBLASLt's A is the caller's B
            self._a_pointer.value, self._b_pointer.value = pointers[1], pointers[0]
        else:
            self._a_pointer.value, self._b_pointer.value = pointers[0], pointers[1]
        if pointers[2] is not None and self._c_pointer is not None:
            self._c_pointer.value = pointers[2]
        if input_names:
            inputs = self._epilog_inputs
            for key, pointer in zip(input_names, pointers[3:]):
                given = inputs.get(key)  # None: an input this epilog does not take (warned about, ignored)
                if given is not None and pointer != given.ptr:
                    self._input_setters[key](pointer)
                    inputs[key] = _replace_ptr(given, pointer)
        # plain numbers equal to the last ones skip the write; anything else is checked by set()
        if type(alpha) not in _NUMBERS or type(beta) not in _NUMBERS or alpha != self._alpha.value \
                or beta != self._beta.value:
            self._alpha.set(alpha)
            self._beta.set(beta)
        if self._split is not None:  # the two-call form runs instead: its masking plan takes the operands
            self._split.masked._rebind(pointers, input_names, alpha, beta)

    def _forget_arrays(self) -> None:
        """Drop every reference to the caller's arrays (pointers and layouts stay): the operands as
        read, their host originals, the epilog inputs, and the first operands the problem was read from."""
        held = [*self._operands.values(), *self._host_operands.values(),
                *getattr(self, "_input_operands", {}).values(), self.operands.a.op, self.operands.b.op]
        if self.operands.c is not None:
            held.append(self.operands.c.op)
        for op in held:
            if op is not None:
                op.obj = None
        self._scales.forget_arrays()
        if self._split is not None:
            self._split.masked._forget_arrays()

    # ---- lifetime ----------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._freed:
            raise NvblasltValueError("this Matmul was freed; make a new one")

    def _check_planned(self) -> None:
        self._check_alive()
        if self._released:
            raise NvblasltValueError("execute: release_operands() dropped the operands; call reset_operands() first")
        if not self._planned:
            raise NvblasltValueError("execute/autotune: call plan() first")

    def _release_plan(self) -> None:
        for owned in (getattr(self, "_desc", None), getattr(self, "_preference", None),
                      *getattr(self, "_layouts", ())):
            if owned is not None:
                owned.close()
        if self._workspace is not None:
            self._workspace.release()
            self._workspace = None
        if self._scratch is not None:  # sized for this plan's outputs
            self._scratch.release()
            self._scratch = None

    def free(self) -> None:
        """Release descriptors and device memory, stream-ordered after the work already queued."""
        if not self._freed:
            with self._lock:
                if self._split is not None:
                    self._split.free()
                    self._split = None
                self._release_plan()
                for owned in (self._scales.buffer, *self._staged.values()):
                    if owned is not None:
                        owned.release()
                self._forget_arrays()
                self._planned = False
                self._freed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._freed else (self.epilog.name if self._planned else "not planned")
        return f"<Matmul {self.operands.describe()} {state}>"


class _PlanView:
    """What the algorithm check reads of a plan, before the plan is the Matmul's."""

    def __init__(self, lib, handle, desc, layouts, problem):
        self._lib, self._handle, self._desc, self._layouts, self.problem = lib, handle, desc, layouts, problem


class _ForeignHandle:
    """A cublasLtHandle_t the caller owns (``options.handle``): used, never destroyed."""

    def __init__(self, handle: int):
        self.handle = handle

    def close(self) -> None:
        pass


def _raw_function(function):
    """The same C function with no argtypes and no status check: the caller passes ctypes objects
    only (a Python int would go as a 32-bit C int) and checks the status itself."""
    return ctypes.CFUNCTYPE(function.restype)(ctypes.cast(function, ctypes.c_void_p).value)


def _replace_ptr(value, pointer: int):
    from dataclasses import replace

    return replace(value, ptr=pointer)


def _require_same(name: str, old, new, what_matters=("shape", "strides", "dtype", "device", "conjugated")) -> None:
    for what in what_matters:
        if getattr(old, what) != getattr(new, what):
            raise NvblasltValueError(f"{name}: the plan was made for {what} {getattr(old, what)}, got "
                                     f"{getattr(new, what)}; make a new Matmul for a different problem")
    if "device" in what_matters and new.alignment < old.alignment:
        raise NvblasltValueError(f"{name}: pointer 0x{new.ptr:x} is aligned to {new.alignment} bytes, but the "
                                 f"plan's algorithms assume {old.alignment}; make a new Matmul")


def _guard_known_bad(found: list[HeuristicResult], problem) -> list[HeuristicResult]:
    """Drop algorithms seen to give wrong results for this problem (see ``_known_bad``)."""
    from ._known_bad import refuses

    return [r for r in found if not refuses(r, problem)]


def _unsupported_hint(problem, epilog, refused_known_bad: bool = False) -> str:
    rows = [side.layout.order != COL for side in (problem.a, problem.b)]
    if any(rows) and any(side.op == 2 for side in (problem.a, problem.b)):
        return ("conjugating a column-major operand needs cuBLASLt's row-major order (OP_C also transposes), "
                "which has no kernel here; conjugate a row-major A/B, or pass both in the same order")
    if refused_known_bad:
        return ("every algorithm cuBLASLt offers for this problem is one seen to give wrong results here "
                "(nvblaslt._known_bad), so nvblaslt refuses rather than return them")
    if problem.fp8:
        return "fp8 kernels need a row-major A and a column-major B (the 'TN' layout) and a supported result type"
    if epilog.name in ("BGRADA", "BGRADB"):
        return (f"{epilog.name} has kernels only for some layouts (on cuBLASLt 13.1: BGRADA with a column-major A, "
                f"BGRADB with a row-major B)")
    rows = [problem.a.layout.order, problem.b.layout.order]
    if any(o != COL for o in rows):
        return "this layout needed cuBLASLt's row-major order, which has no kernel here; pass column-major operands"
    return f"no algorithm for {problem.describe()} on this GPU"


__all__ = ["Matmul", "MatmulOptions", "MatmulPlanPreferences", "OP_N", "OP_T"]
