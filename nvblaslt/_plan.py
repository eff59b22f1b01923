"""``Matmul``: D = epilog(alpha · A @ B + beta · C), planned once, executed many times.

The path of one plan, downward: the operands are read (``_operands``; host ones staged by
``_host``) and normalized into one canonical cuBLASLt problem (``_problem``); ``_epilogs``
prepares the epilog on it; ``_launch`` builds the descriptors and asks the heuristics (or the
tuning cache, ``_tuning_cache``); ``_results`` makes the outputs. ``execute`` binds nothing new
and launches. Beside that path: alpha, beta and the fp8 scales (``_scales``), ``out=``
(``_outputs``), results copied back to the host (``_host``), tuning (``_autotune``); and the
resets (``reset_operands``, ``reset_operands_unchecked``, ``release_operands``), which replace what
the plan reads, all or nothing.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, cast

from . import _cuda, _dtypes, _epilogs, _host, _memory, _operands, _reading, _tuning_record
from ._cuda import cudart
from ._descriptors import HeuristicResult, check_handle_device
from ._epilogs import SPECS, MatmulEpilog, as_epilog
from ._frameworks import PROTOCOL, Framework
from ._hints import Array, EpilogLike, Options, Preferences, QuantizationScales, ScalarLike, Stream
from ._errors import NvblasltArgumentError, NvblasltStateError, NvblasltValueError
from ._launch import Launch, algorithm_ids
from ._loader import library
from ._logging import logger
from ._options import (MatmulOptions, MatmulPlanPreferences, as_options, check_heuristics_limit, conjugate_flags,
                       with_shortcuts)
from ._outputs import OutputChecker
from ._problem import OP_N, OP_T, Operands, Problem, canonical
from ._results import Results
from ._scales import Scalar, Scales
from ._split_bgrad import SplitBiasGradient, splittable
from ._streams import stream_handle
from ._types import cuda_type_names

if TYPE_CHECKING:  # the default (PEP 696) is read by type checkers; typing_extensions is no run-time dependency
    from typing_extensions import TypeVar

    from ._protocols import PlanInternals, TunedPlan
    from ._request import MatmulRequest
    from ._tuning_result import TuningReport, TuningResult

    ResultT = TypeVar("ResultT", default=Any)
else:
    from typing import TypeVar

    ResultT = TypeVar("ResultT")

_NUMBERS = (float, int)  # alpha/beta types the function form's rebinding compares without re-checking


class CheckedPlan(NamedTuple):
    """``plan()``'s arguments checked (no GPU work yet): the canonical problem and the epilog prepared on it."""

    epilog: MatmulEpilog
    preferences: Any  # MatmulPlanPreferences, its epilog preferences made a dataclass by as_options
    problem: Problem
    aux_dtype: Any
    aux_scale: Any  # the fp8 aux scale's value, checked; None without one
    inputs: dict  # the epilog inputs as read (host ones not yet staged)
    prepared: Any  # _epilogs.Prepared, on the inputs' device layouts
    algorithms: Sequence[Any] | None  # the caller's, or None: the heuristics are asked


class Matmul(Generic[ResultT]):
    """A matrix multiplication ``D = epilog(alpha * a @ b + beta * c)``, planned once and executed
    as often as needed (nvmath-python's ``Matmul``).

    The constructor reads the operands and checks their shapes, dtypes and memory space; host
    operands are then staged to the GPU. ``plan()`` builds the cuBLASLt descriptors for an epilog
    and asks the heuristics for algorithms; ``autotune()`` optionally times them; ``execute()``
    then launches with every argument prebuilt, returning D, or ``(D, aux)`` when the epilog has
    outputs (or ``options.result_amax`` is set). ``reset_operands()`` points the plan at new
    arrays of the same layout. Results come back in the operands' package and memory space.
    Use it as a context manager, or call ``free()`` when done.

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
        Scales ``a @ b``; default 1. Read once, as a number (a GPU array is copied back, which
        waits for it); ``reset_operands(alpha=…)`` changes it. Complex only with complex operands.
    beta : number or one-element array, optional
        Scales ``c``: required with ``c``, refused without it (as in nvmath-python).
    qualifiers : numpy.ndarray, optional
        nvmath-python's length-3 array of ``nvblaslt.matrix_qualifiers_dtype`` (A, B, C): its
        ``is_conjugate`` fields conjugate ``a`` and/or ``b`` (complex operands; conjugating C is
        refused). A lazily conjugated PyTorch view flips its operand's flag too.
    quantization_scales : MatmulQuantizationScales or dict, optional
        Scales for fp8 operands and results, keys ``"a"``, ``"b"``, ``"c"``, ``"d"``: numbers,
        or float32 GPU arrays of shape () or (1,) read at each execution. Required for every fp8
        operand and an fp8 result, refused for any other.
    options : MatmulOptions or dict, optional
        How the multiplication is set up (compute and result types, ``inplace``, ``blocking``,
        ``device_id``, ``handle``, ``memory_limit``, …); a dict takes the same keys, and
        nvmath-python's own ``MatmulOptions`` is accepted too.
    stream : int or stream object, optional
        The plan's stream: operands are read (the DLPack / CUDA array interface handshake) and
        staged on it, and ``plan()``, ``autotune()`` and ``execute()`` use it unless given another.
        An int ``cudaStream_t`` (0, 1 and 2 are CUDA's legacy, explicit legacy and per-thread
        default streams), a CuPy or PyTorch stream, a cuda.bindings stream, or anything with
        ``__cuda_stream__``. Default: the operands' package's current stream on their device, as
        it is now (the legacy default stream for host operands).
    compute_type : str or int, optional
        Shortcut for ``options.compute_type``; refused if ``options`` sets it too.
    result_type : str, dtype or int, optional
        Shortcut for ``options.result_type``; refused if ``options`` sets it too.

    Attributes
    ----------
    tuning_report : TuningReport
        Set by ``autotune()``: what it chose and how sure it is (``print`` it).
    device : int
        The GPU the plan runs on.
    stream : int
        The plan's stream, as a ``cudaStream_t``.
    bias_gradient_form : tuple or None
        Set by ``autotune(search=True)`` on a bias-gradient plan (``*_BGRAD``, ``BGRADA``, ``BGRADB``):
        ``(form, its ms, the other form's ms)``, form ``"fused"`` or ``"split"``.

    Raises
    ------
    NvblasltTypeError
        ``a`` or ``b`` is None or no array, the operands come from different packages,
        ``options`` is neither a dict nor ``MatmulOptions``, or ``stream`` cannot be read.
    NvblasltValueError
        Shapes that do not multiply (K, batch, ``c``'s shape), operands on different GPUs,
        ``beta`` missing with ``c`` or given without it, an fp8 operand in the wrong order, scales
        missing or given where none is taken, an invalid option value (``compute_type`` given
        twice, ``result_amax`` for a result that is not fp8, a negative ``device_id``…).
    NvblasltArgumentError
        A dtype or combination of dtypes cuBLASLt cannot multiply, or operands in different
        memory spaces (host and GPU). Both a ``TypeError`` and a ``ValueError``.
    CudaError
        Staging host operands or writing the scales failed (no usable GPU and driver, memory).

    Warns
    -----
    UserWarning
        ``options.result_type`` is given with ``options.inplace``: the result is ``c`` itself, of
        ``c``'s dtype, and the result type is ignored (nvmath-python ignores it too, and logs so).

    See Also
    --------
    matmul : the function form, with a per-thread cache of these plans.
    MatmulEpilog : the epilogs ``plan()`` takes.

    Notes
    -----
    The methods follow nvmath-python's ``Matmul``: ``plan``, ``autotune``, ``execute``,
    ``reset_operands``, ``release_operands``, ``free``, ``applicable_algorithm_ids``,
    ``algorithms`` and ``algorithm``. nvblaslt adds ``execute(out=…)``,
    ``reset_operands_unchecked``, ``autotune(search=True)`` and the ``compute_type`` /
    ``result_type`` keywords. Every check that needs no GPU runs before any GPU work.

    One plan may be used from several threads: its launches are serialized, and a new stream is
    ordered after the work queued on the previous one (the workspace is shared).

    To a type checker, ``Matmul`` is generic in what ``execute()`` returns. That depends on the
    epilog ``plan()`` is given, not on the constructor's arguments, so an unannotated plan's
    ``execute()`` is ``Any``. Annotate the plan to have its results checked:
    ``Matmul[torch.Tensor](x, w)`` (or ``mm: Matmul[torch.Tensor] = Matmul(x, w)``) for an epilog
    without outputs, ``Matmul[tuple[torch.Tensor, dict[str, torch.Tensor]]]`` for one with
    outputs. Only type checkers read the parameter: ``Matmul[…](…)`` makes the same plan.

    Examples
    --------
    On a GPU, with CuPy arrays (the results are CuPy arrays):

    .. code-block:: python

        import cupy
        from nvblaslt import Matmul

        w = cupy.random.rand(256, 784, dtype=cupy.float32)
        x = cupy.random.rand(784, 100, dtype=cupy.float32)
        bias = cupy.random.rand(256, dtype=cupy.float32)

        with Matmul(w, x) as mm:                      # freed on leaving the block
            algorithms = mm.plan(epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias},
                                 preferences={"limit": 8})
            timings = mm.autotune(iterations=5)       # [(algorithm, ms)], the selected one first
            y, aux = mm.execute()                     # y = relu(w @ x + bias[:, None]); aux["relu_aux"]
            mm.execute(out=y)                         # D into y again (aux is a new array)
            mm.reset_operands(b=cupy.random.rand(784, 100, dtype=cupy.float32))
            y2, aux2 = mm.execute()

    The operands are checked where the plan is made, before any GPU work:

    >>> import numpy as np
    >>> import nvblaslt
    >>> a, b, c = np.ones((4, 3)), np.ones((3, 2)), np.ones((4, 2))
    >>> nvblaslt.Matmul(a, b, c)
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: beta: A value for beta must be provided if operand C is provided
    >>> nvblaslt.Matmul(a, b, options={"blocking": False})
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: options.blocking: The value specified for blocking must be either True or 'auto'. ...
    """

    # The package's own modules (the function form, the split form, the tuner, the framework layers) call
    # the underscored methods declared in ``_protocols.PlanInternals`` and ``TunedPlan``: the user's object
    # shows nvmath-python's API and nvblaslt's documented additions alone.

    def __init__(self, a: Array, b: Array, /, c: Array | None = None, *, alpha: ScalarLike | None = None,
                 beta: ScalarLike | None = None, qualifiers: Any = None, quantization_scales: QuantizationScales = None,
                 options: Options = None, stream: Stream | None = None, compute_type: Any = None,
                 result_type: Any = None) -> None:
        checked = with_shortcuts(options, compute_type, result_type)
        ops, framework, stream_h = _reading.read_operands(a, b, c, stream)
        self._setup(ops, c is not None, framework, stream_h, checked, alpha=alpha, beta=beta, qualifiers=qualifiers,
                    quantization_scales=quantization_scales, stacklevel=3)

    @classmethod
    def _from_operands(cls, a, b, c, *, stream: int, options: MatmulOptions, alpha=None, beta=None,
                       quantization_scales=None) -> Matmul:
        """A Matmul over operands already read (``_operands.Operand``): the split form's and the JAX
        bridge's way in; their options are warned about where they were made."""
        self = cls.__new__(cls)
        self._setup([x for x in (a, b, c) if x is not None], c is not None, a.framework, stream, options, alpha=alpha,
                    beta=beta, qualifiers=None, quantization_scales=quantization_scales)
        return self

    @classmethod
    def _planned_for(cls, request: MatmulRequest, stacklevel: int) -> Matmul:
        """The function form's plan for one checked call (``_request.MatmulRequest``): its plan arguments
        are checked once, before any GPU work (host operands staged), ``out`` against the result's layout
        before the heuristics run, then it is planned; freed where any of that refuses. ``stacklevel``:
        where the caller's options are warned about."""
        self = cls.__new__(cls)
        checked = cast(CheckedPlan, self._setup(  # with plan arguments, their checked form
            [x for x in (request.a, request.b, request.c) if x is not None], request.c is not None, request.framework,
            request.stream, request.options, alpha=request.alpha, beta=request.beta, qualifiers=request.qualifiers,
            quantization_scales=request.quantization_scales, plan_arguments=request.plan_arguments,
            stacklevel=stacklevel + 1))
        try:
            if request.out is not None:
                OutputChecker(self._framework, self._host, checked.problem, self.device, self._operands,
                              {}).pointer(request.out, request.stream)
            with _cuda.on_device(self.device):
                self._plan(checked)
        except BaseException:
            self.free()
            raise
        return self

    def _setup(self, ops, has_c: bool, framework: Framework, stream, options, *, alpha, beta, qualifiers,
               quantization_scales, plan_arguments: tuple | None = None,
               stacklevel: int | None = None) -> CheckedPlan | None:
        self._options, self._logger, self._lib = options, options.logger or logger, library()
        self._framework = framework
        self._lock = threading.Lock()
        self._released: set[str] | None = None
        self._planned = self._freed = False
        self._launch: Launch = None  # type: ignore[assignment]  # made by plan()
        self._split_form: SplitBiasGradient | None = None  # the two-call form, when tuning found it faster
        self.tuning_report: TuningReport | None = None  # what the last autotune() chose, over what, how sure
        self.bias_gradient_form: tuple | None = None  # after a search of a *_BGRAD plan: (form, ms, other ms)
        self._fast_bound: list | None = None  # the function form's pointers bound now (default scalars), if any
        self._staged: dict[str, _memory.DeviceBuffer] = {}
        self._host_operands: dict = {}
        self._input_operands: dict = {}  # epilog inputs as read (host ones: their device copies)
        if options.device_id < 0:
            raise NvblasltValueError(f"options.device_id: expected a GPU ordinal (int ≥ 0), got {options.device_id}")
        hosts = {op.host for op in ops}
        if len(hosts) > 1:
            raise NvblasltArgumentError("a, b, c: operands are not on the same device: they must all be in GPU "
                                        "memory or all in host memory")
        self._host = hosts.pop()
        self._blocking = self._host or options.blocking is True
        self._hand_back = not framework.has_pool and not self._host  # results in nvblaslt's own memory
        self.device = options.device_id if self._host else ops[0].device
        if not self._host:
            for name, op in zip("abc", ops):
                if op.device != self.device:
                    raise NvblasltValueError(f"{name}: on GPU {op.device}, but a is on GPU {self.device}")
        if options.handle is not None:
            check_handle_device(options.handle, self.device)
        if stream is None:  # host operands: no framework stream to ask
            stream = framework.stream_getter(self.device)() if not self._host else 0
        self.stream = self._last_stream = stream
        host_ops = ops
        if self._host:  # checked as their device copies will be laid out, before anything is copied
            ops = [_host.device_layout(op, self.device) for op in ops]
        a, b, c = ops[0], ops[1], (ops[2] if has_c else None)
        if c is not None and c.conjugated:
            raise NvblasltValueError("c: a conjugate view cannot be read (cuBLASLt has no conjugate C); call "
                                     ".resolve_conj() first")
        conjugate = conjugate_flags(qualifiers)  # a lazy-conjugate view flips its operand's flag, as in nvmath
        conjugate = (conjugate[0] != a.conjugated, conjugate[1] != b.conjugated)
        self._problem_operands = Operands(self._lib.api, a, b, c, compute_type=options.compute_type,
                                 scale_type=options.scale_type, result_type=options.result_type,
                                 inplace=options.inplace, conjugate=conjugate)
        self._operands = {"a": a, "b": b, "c": c}
        types = self._problem_operands.types
        if has_c and beta is None:
            raise NvblasltValueError("beta: A value for beta must be provided if operand C is provided")
        if beta is not None and not has_c:
            raise NvblasltValueError("beta: given without c; pass c (the matrix beta scales) or drop beta")
        self._alpha, self._beta = Scalar(types.scale, "alpha"), Scalar(types.scale, "beta")
        if options.inplace and options.result_type is not None and stacklevel is not None:
            # nvmath-python ignores it too, and logs a warning: said here as for options.fast_accumulation
            warnings.warn(f"options.result_type: ignored in place, where the result is c itself (so "
                          f"{types.d.name}); got {options.result_type!r}", UserWarning, stacklevel=stacklevel)
        if options.result_amax and types.d not in _dtypes.FLOAT8:
            raise NvblasltValueError(f"options.result_amax: result_amax=True is allowed only for narrow-precision "
                                     f"(FP8 and lower) results; the result is {types.d.name}")
        self._scales = Scales(types, self.device, self._host, has_c)
        scales = self._scales.check(quantization_scales, stream)
        if plan_arguments is None:
            # an operand no epilog can read (fp8 order) is refused now
            canonical(self._problem_operands, MatmulEpilog.DEFAULT)
            checked = None
        else:  # the function form's plan to come: its arguments checked now, once (its problem refuses the same)
            checked = self._checked_plan_arguments(*plan_arguments)
        # a GPU scalar is copied back (which waits): after every check that needs nothing of it
        self._alpha.set(1.0 if alpha is None else alpha)
        self._beta.set(0.0 if beta is None else beta)
        # Every check that needs no GPU has run: now the GPU work, host copies and scales included.
        self._several_devices = _cuda.several_devices()
        with _cuda.on_device(self.device):
            if self._host:
                for name, op in zip("abc", host_ops):
                    self._operands[name], self._staged[name] = _host.stage(op, self.device, stream)
                    self._host_operands[name] = op
            if scales:
                self._scales.write(scales, stream)
        return checked

    # ---- planning ----------------------------------------------------------------------------------
    @property
    def algorithms(self) -> list[HeuristicResult]:  # the planned algorithms, best first
        """The planned algorithms, best first: ``plan()``'s list, in ``autotune()``'s timed order
        once it has run (less what ``prune`` dropped); ``[]`` before ``plan()``. The first is
        selected unless ``execute(algorithm=…)`` chose another."""
        return self._launch.algorithms if self._launch is not None else []

    @property
    def algorithm(self) -> HeuristicResult | None:  # the selected one
        """The algorithm ``execute()`` runs (a ``HeuristicResult``); None before ``plan()``."""
        return self._launch.algorithm if self._launch is not None else None

    def plan(self, *, epilog: EpilogLike = None, epilog_inputs: dict[str, Any] | None = None,
             preferences: Preferences = None, algorithms: Sequence[Any] | None = None,
             stream: Stream | None = None) -> list[HeuristicResult]:
        """Build the cuBLASLt descriptors for ``epilog`` and ask the heuristics for algorithms.

        The epilog inputs are read and checked against the problem, the matmul descriptor, the
        matrix layouts and the preference are built, and the heuristics (or the caller's
        ``algorithms``) give the list of algorithms, best first; the first is selected and its
        workspace allocated. ``plan()`` may be called again, with another epilog for example: the
        new plan replaces the old once it is whole (a refused ``plan()`` leaves the old one).

        Parameters
        ----------
        epilog : MatmulEpilog, str or int, optional
            What to fuse after the multiplication: a ``MatmulEpilog`` member, its name (any case)
            or its cuBLASLt value; None is ``MatmulEpilog.DEFAULT``. It must be an epilogue of the
            loaded cuBLASLt.
        epilog_inputs : dict, optional
            Exactly the arrays the epilog reads, by key, in the operands' memory space:
            ``"bias"`` for the ``*BIAS`` epilogs (one value per row of D: (M,), (M, 1), or
            batched (…, M, 1) / (…, M); in D's dtype, with fp8 operands also bfloat16 or
            float16, and only those for an fp8 D),
            ``"relu_aux"`` for ``DRELU`` / ``DRELU_BGRAD`` and ``"gelu_aux"`` for ``DGELU`` /
            ``DGELU_BGRAD`` (as the forward epilog returned them), and
            ``"aux_quantization_scale"`` (a number) with an fp8 GELU aux
            (``preferences.epilog.aux_type``). The plan reads these arrays at every
            ``execute()``: keep them alive, or replace them with ``reset_operands(epilog_inputs=…)``.
        preferences : MatmulPlanPreferences or dict, optional
            What the heuristics may return; default ``MatmulPlanPreferences()`` (up to 8
            algorithms, 32 MiB of workspace).
        algorithms : sequence, optional
            Algorithms to use instead of asking the heuristics: ``HeuristicResult`` objects from
            an earlier ``plan()`` or ``autotune()``, nvmath-python's ``Algorithm`` objects, or the
            64 bytes of ``HeuristicResult.as_bytes()``. cuBLASLt checks each for this plan.
        stream : int or stream object, optional
            Becomes the plan's stream, for this call and those after it (as in the constructor).

        Returns
        -------
        list of HeuristicResult
            The algorithms, best first; the first is selected. Without ``algorithms``, one an
            earlier ``autotune(search=True)`` remembered for this problem comes first.

        Raises
        ------
        NvblasltStateError
            The plan was freed.
        NvblasltTypeError
            ``epilog`` is neither a member, a name nor a value; ``epilog_inputs`` is not a dict;
            ``preferences`` is neither a dict nor ``MatmulPlanPreferences``; ``algorithms`` is
            not a non-empty list or tuple; ``stream`` cannot be read.
        NvblasltValueError
            An unknown epilog, or one the loaded cuBLASLt lacks; epilog inputs missing, unexpected,
            or of the wrong shape, strides or batch; K = 1 with a ``DRELU*`` / ``DGELU*`` epilog;
            an epilog that needs a column-major D with a row-major ``c``; an algorithm cuBLASLt's
            check refuses for this plan; an invalid preference.
        NvblasltArgumentError
            A bias or aux of the wrong dtype, or in the other memory space than the operands.
        NvblasltAlgorithmError
            An item of ``algorithms`` is not an algorithm.
        CublasLtError
            cuBLASLt has no algorithm for the problem (``CUBLAS_STATUS_NOT_SUPPORTED``, with what
            is known of why); ``preferences.limit`` is 0 and no ``algorithms`` are given
            (``CUBLAS_STATUS_INVALID_VALUE``, as nvmath-python's users get it, refused before any
            GPU work; also a ``ValueError``).
        CudaError
            The workspace could not be allocated.

        Warns
        -----
        UserWarning
            ``options.fast_accumulation`` is set for operands that are not fp8 (it does nothing
            there; nvmath-python accepts it too).

        Examples
        --------
        .. code-block:: python

            found = mm.plan(epilog="GELU_AUX_BIAS", epilog_inputs={"bias": bias})
            print(found[0])                            # <HeuristicResult id=… tile=… stages=… …>
            saved = found[0].as_bytes()                # 64 bytes, kept as long as you like
            mm.plan(epilog="GELU_AUX_BIAS", epilog_inputs={"bias": bias}, algorithms=[saved])
        """
        self._check_alive()
        if stream is not None:
            self.stream = stream_handle(stream)
        with _cuda.on_device(self.device):
            return self._plan(self._checked_plan_arguments(epilog, epilog_inputs, preferences, algorithms))

    def _checked_plan_arguments(self, epilog, epilog_inputs, preferences, algorithms) -> CheckedPlan:
        """plan()'s checks that need no GPU; host inputs prepared on their device copies' layout."""
        lib = self._lib
        epilog = as_epilog(epilog)
        if epilog.name not in lib.api.cublasLtEpilogue_t.__members__:
            version = ".".join(map(str, lib.version_tuple))
            raise NvblasltValueError(f"epilog: {epilog.name} is not an epilogue of the loaded cuBLASLt {version}")
        prefs = as_options(MatmulPlanPreferences, preferences, "preferences")
        if algorithms is None:  # the heuristics will be asked: a limit they refuse is refused now
            check_heuristics_limit(prefs, lib)
        # 1. the canonical problem; 2. the epilog prepared on it
        problem = canonical(self._problem_operands, epilog)
        given, aux_scale = _epilogs.split_aux_scale(epilog_inputs)
        aux_dtype = _epilogs.aux_output_type(SPECS[epilog], problem.types, prefs.epilog, aux_scale,
                                             cuda_type_names(lib.api))
        if aux_scale is not None:
            aux_scale = self._scales.check_values({"aux": aux_scale}, self.stream,
                                                  "epilog_inputs['aux_quantization_scale']")["aux"]
        keys = _epilogs.input_keys(epilog, given, problem)
        inputs = {key: _reading.read_input(key, given[key], self._host, self.device, self.stream) for key in keys}
        laid_out = {k: _host.device_layout(op, self.device) if op.host else op for k, op in inputs.items()}
        prepared = _epilogs.prepare(epilog, problem, laid_out, aux_dtype, prefs.epilog.aux_amax)
        return CheckedPlan(epilog, prefs, problem, aux_dtype, aux_scale, inputs, prepared, algorithms)

    def _plan(self, checked: CheckedPlan) -> list[HeuristicResult]:
        lib = self._lib
        epilog, prefs, problem, aux_dtype, aux_scale, inputs, prepared, algorithms = checked
        # host inputs: copied once checked (the plan's once it commits), and prepared on their copies
        staged = {key: _host.stage(op, self.device, self.stream) for key, op in inputs.items() if op.host}
        if staged:
            inputs.update((key, copy) for key, (copy, _) in staged.items())
            prepared = _epilogs.prepare(epilog, problem, inputs, aux_dtype, prefs.epilog.aux_amax)
        previous_aux = self._scales.value("aux")
        if aux_scale is not None:  # its slot's address is known now; its value is written at commit
            self._scales.stage({"aux": aux_scale}, self.stream)
        # 3. the launch: descriptors, the caller's algorithms or the heuristics' (and the tuning cache's), workspace
        launch = None
        try:
            launch, found, remembered = Launch.planned(
                lib, problem, prepared, options=self._options, preferences=prefs, scales=self._scales,
                operands=self._operands, aux_scale=aux_scale is not None, device=self.device, alpha=self._alpha,
                beta=self._beta, algorithms=algorithms, stream=self._last_stream)
            results = Results(launch, problem, prepared, framework=self._framework, host=self._host,
                              device=self.device, result_amax=bool(self._options.result_amax))
        except BaseException:
            if launch is not None:
                launch.close()
            if aux_scale is not None:  # the committed plan keeps its aux scale: its slot was never written
                self._scales.unstage("aux", previous_aux)
            raise
        # 4. commit: the previous plan goes, this one takes its place
        if aux_scale is not None:  # after the work queued so far, which may read the slot's old value
            _memory.wait_for(self._last_stream, self.stream)
            self._scales.write({"aux": aux_scale}, self.stream)
        self._planned = False  # until the new plan is whole: execute() must not launch with what is released here
        self._release_plan()
        self._problem, self._epilog, self._launch, self._prepared = problem, epilog, launch, prepared
        self._results = results
        self._input_operands, self._allocate_result = inputs, results.allocate_d
        self._staged.update((key, buffer) for key, (_, buffer) in staged.items())
        self._framework_stream = (PROTOCOL if self._host else self._framework).stream_getter(self.device)
        self._out_checker = OutputChecker(self._framework, self._host, problem, self.device, self._operands,
                                          prepared.inputs)
        self._input_setters = {key: launch.pointer_setter("BIAS_POINTER" if key == "bias" else "EPILOGUE_AUX_POINTER")
                               for key in inputs}
        self._bind()
        launch.select(found[0])
        self.tuning_report = None  # of the algorithms planned before
        self._planned = True
        self._logger.debug("plan %s: %d algorithms, first %s", problem.describe(), len(found), found[0])
        if remembered.get("bias_gradient_form") == "split" and self._splittable():
            self._split_form = self._make_split_form(iterations=0)  # its first plan recalls its own choice
        _tuning_record.note(self, epilog, inputs)  # $NVBLASLT_RECORD: the problem, for `nvblaslt tune` later
        return found

    def _splittable(self) -> bool:
        """Whether its epilog has a two-call form for its operands (``_split_bgrad.splittable``)."""
        return splittable(self._epilog, self._operands, self._problem, self._problem_operands)

    def _make_split_form(self, iterations: int) -> SplitBiasGradient | None:
        """A *_BGRAD epilog as two plans: D without the bias gradient (the masking epilog, or the plain
        GEMM), then the bias gradient as a GEMV over D or the summed input; None where they cannot be
        made. ``iterations`` > 0 autotunes the first plan; 0 keeps what it planned (or recalled)."""
        self._fast_bound = None  # the function form's next call must bind the first plan too
        return SplitBiasGradient.build(Matmul._from_operands, self._operands, self._input_operands, self._prepared,
                                       self._launch, self._options, self._alpha.value, self._beta.value,
                                       self._framework, self.device, self.stream, iterations)

    def autotune(self, *, iterations: int = 5, prune: int | None = None, search: bool = False,
                 remember: bool = True, stream: Stream | None = None) -> list[tuple[HeuristicResult, float]]:
        """Time the planned algorithms on this plan's operands and select the fastest.

        Each algorithm of ``algorithms`` runs once to warm up, then ``iterations`` times in
        shuffled interleaved rounds, timed with CUDA events with the L2 cache flushed before each
        run. The heuristics' first pick stays selected unless one of the two fastest others
        (read faster than it, or within 3 %) beats it beyond the noise in an interleaved duel.
        The timed launches write D and the epilog's outputs to the plan's own scratch memory,
        never to the caller's arrays (an in-place ``c`` is read, not written). The call waits
        for the GPU.

        With ``search=True`` it also times configurations the heuristics do not return (their
        ranking further down, their picks for other epilogs, cluster-shape and swizzle variants,
        then other algorithm ids and tiles, as far as the time allows) and switches to a
        challenger only when it is faster than autotune's pick beyond the measured noise (a sign
        test over paired interleaved rounds); for the bias-gradient epilogs it also times the
        two-call form (the masking epilog or the plain GEMM, then the bias gradient as a GEMV)
        against the fused kernel, and keeps the faster. A search takes about 10 seconds at most.

        Parameters
        ----------
        iterations : int, default 5
            Timed runs of each algorithm (values below 1 count as 1); the median is compared.
        prune : int, optional
            Keep only the first ``prune`` algorithms of the timed order in ``algorithms``; None
            keeps them all.
        search : bool, default False
            Also search beyond the heuristics' list, as described above (nvblaslt's addition).
        remember : bool, default True
            After a search, store the choice in the tuning cache on disk
            (``tuning.json`` in ``$NVBLASLT_CACHE_DIR``, default ``$XDG_CACHE_HOME/nvblaslt`` or
            ``~/.cache/nvblaslt``),
            keyed by GPU, cuBLASLt version and the plan's descriptors, so that later plans of the
            same problem, in this process or another, start from it. Without ``search``, nothing
            is stored.
        stream : int or stream object, optional
            The stream the timing runs on; default the plan's stream.

        Returns
        -------
        list of tuple of (HeuristicResult, float)
            ``(algorithm, milliseconds)``: the selected algorithm first, then every other one
            timed, fastest first. ``algorithms`` takes this order (less what ``prune`` drops).
            Also sets ``tuning_report`` (what was chosen, over what, how sure; ``print`` it), and
            after a search of a bias-gradient plan ``bias_gradient_form``, a
            tuple ``(form, its ms, the other form's ms)`` with form ``"fused"`` or ``"split"``.

        Raises
        ------
        NvblasltStateError
            ``plan()`` was not called (or must be called again after
            ``execute(release_workspace=True)``), the operands were released, or the plan was
            freed.
        NvblasltValueError
            ``prune`` is not a positive int or None.
        NvblasltTypeError
            ``stream`` cannot be read.
        CublasLtError
            A timed launch failed for another reason than cuBLASLt refusing the algorithm
            (algorithms it refuses at launch are left out), or it refused every one.
        CudaError
            A CUDA runtime call failed (events, scratch memory).

        Examples
        --------
        .. code-block:: python

            mm.plan(epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": relu_aux})
            timings = mm.autotune(iterations=10, prune=4)   # keep the four fastest
            best, ms = timings[0]
            mm.autotune(search=True)                        # look beyond them; remembered on disk
            print(mm.tuning_report)                         # what was chosen, and how sure
        """
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise NvblasltValueError(f"iterations: expected a positive int (timed rounds), got {iterations!r}")
        if prune is not None and (isinstance(prune, bool) or not isinstance(prune, int) or prune < 1):
            raise NvblasltValueError(f"prune: expected a positive int (how many algorithms to keep) or None, got "
                                     f"{prune!r}")
        self._check_planned()
        from . import _autotune  # here, not at import: planning and executing never need timing or the search

        launch = self._launch
        selected = launch.algorithm
        with _cuda.on_device(self.device):
            stream_h = stream_handle(stream) if stream is not None else self.stream
            try:
                timings = _autotune.autotune(self, iterations=iterations, search=search, remember=remember,
                                             stream=stream_h)
            except BaseException:  # (a refusal, a CUDA error, Ctrl-C) the plan keeps the algorithm it ran
                if selected is not None:
                    launch.select(selected)
                raise
        if prune:
            launch.keep(launch.algorithms, prune)
        return timings

    def _apply_tuning(self, result: TuningResult) -> list[tuple[HeuristicResult, float]]:
        """Run what ``autotune`` chose (``result``, a ``TuningResult``): its algorithm, the planned ones in
        timed order after it, its report, and after a search of a *_BGRAD plan its bias-gradient form.
        Returns the timings, the selected algorithm first."""
        launch = self._launch
        launch.select(result.chosen)
        launch.keep(result.ordered(launch.algorithms), None)
        if result.bias_gradient_form is not None:  # a searched *_BGRAD plan: the form chosen replaces the one held
            held, self._split_form = self._split_form, result.split_form
            if held is not None and held is not result.split_form:
                held.free()
            self.bias_gradient_form = result.bias_gradient_form
            self._fast_bound = None  # the function form's next call binds the form that runs now
        self.tuning_report = result.report
        return result.timings

    def _use_fused_form(self) -> None:
        """Run the fused kernel again where a search chose the two-call bias-gradient form (the JAX
        bridge's XLA call runs one cublasLtMatmul)."""
        if self._split_form is not None:
            self._split_form.free()
            self._split_form = None
            self._fast_bound = None

    def applicable_algorithm_ids(self, limit: int = 8) -> list[int]:
        """The ids of the algorithms cuBLASLt has for this plan's types (nvmath-python's method).

        Asks ``cublasLtMatmulAlgoGetIds`` for the compute type, the scale type and the A, B, C
        and D data types; shapes, layouts and the epilog play no part, so no ``plan()`` is needed.
        An id names a family of kernels (``Algorithm.capability`` tells its tiles, stages, …), not
        one that necessarily suits this problem.

        Parameters
        ----------
        limit : int, default 8
            The most ids to return, a positive int.

        Returns
        -------
        list of int
            At most ``limit`` algorithm ids, in cuBLASLt's order.

        Raises
        ------
        NvblasltStateError
            The plan was freed.
        NvblasltValueError
            ``limit`` is not a positive int.
        CublasLtError
            The library refuses the types, or has no handle for the GPU.

        Examples
        --------
        .. code-block:: python

            ids = mm.applicable_algorithm_ids(limit=16)    # a list of up to 16 ints
        """
        self._check_alive()
        with _cuda.on_device(self.device):
            return algorithm_ids(self._lib, self._problem_operands.types, self._options, self.device, limit)

    # ---- execution ---------------------------------------------------------------------------------
    def execute(self, *, algorithm: HeuristicResult | None = None, release_workspace: bool = False,
                stream: Stream | None = None, out: Array | None = None) -> ResultT:
        """Run the planned multiplication on the current operands.

        Every argument of the ``cublasLtMatmul`` call is prebuilt: a call allocates D (unless
        ``out`` is given or the plan is in place) and the epilog's outputs, and launches. The
        work is queued on the stream and the call returns without waiting, unless the operands
        are host arrays (the results are copied back, which waits) or ``options.blocking`` is
        True. Where cuBLASLt refuses the selected algorithm at launch, the next planned one is
        tried.

        Parameters
        ----------
        algorithm : HeuristicResult, optional
            Run this one of the planned algorithms (``algorithms``), from this call on: one that
            ``plan()`` or ``autotune()`` returned, nvmath-python's ``Algorithm``, or its 64 bytes
            (``HeuristicResult.as_bytes()``). An algorithm that was not planned is refused
            (``plan(algorithms=[…])`` takes it).
        release_workspace : bool, default False
            Free the plan's workspace after this call (stream-ordered). The plan then needs
            ``plan()`` again before the next ``execute()`` or ``autotune()``.
        stream : int or stream object, optional
            Where to launch this time; default the plan's stream. A stream other than the one
            used last is first ordered after the work queued there (the workspace is shared).
        out : array, optional
            nvblaslt's addition: write D into this array instead of a new one. It must be of the
            operands' package, laid out as D would be (shape, dtype, element strides), on the
            plan's GPU, writable, 256-byte aligned, and apart from ``a``, ``b`` and the epilog
            inputs (it may be ``c`` itself). Not available with host operands or in-place plans.
            Checked once per array: the same unchanged array is not checked again.

        Returns
        -------
        array or tuple of (array, dict)
            D, as an array of the operands' package and memory space (``out`` itself if given,
            ``c`` itself in place). An epilog with outputs, or ``options.result_amax``, returns
            ``(D, aux)``, with ``aux`` a dict of new arrays of the same package, by key:
            ``"relu_aux"`` (the uint8 ReLU bitmask, (…, ⌈M/128⌉·16, N) column-major),
            ``"gelu_aux"`` ((…, M rounded up to 8, N) column-major), the bias gradients
            ``"drelu_bgrad"``, ``"dgelu_bgrad"``, ``"bgrada"`` ((M,), or (…, M, 1) for a batch)
            and ``"bgradb"`` ((N,), or (…, N, 1)), ``"gelu_aux_amax"`` (with
            ``preferences.epilog.aux_amax``) and ``"result_amax"`` (with
            ``options.result_amax``), float32 of shape (1,).
            To a type checker, the plan's type parameter: ``Any`` unless the plan was
            annotated (see the class's Notes).

        Raises
        ------
        NvblasltStateError
            ``plan()`` was not called, or must be called again after
            ``execute(release_workspace=True)``; the operands were released by
            ``release_operands()`` and not reset; the plan was freed. Also a ``RuntimeError``.
        NvblasltValueError
            ``algorithm`` is not one of the planned algorithms; ``out`` is laid out otherwise
            than D, overlaps an input, is read-only, misaligned or on another GPU, or is given for
            host operands or an in-place plan.
        NvblasltTypeError
            ``out`` is of another package or dtype; ``stream`` cannot be read.
        NvblasltAlgorithmError
            ``algorithm`` is not an algorithm.
        CublasLtError
            The launch failed (``cublasLtMatmul`` returned an error status).
        CudaError
            Allocating a result, copying results back to the host, or waiting for the stream
            failed.

        Examples
        --------
        .. code-block:: python

            # mm planned with an epilog without outputs (RELU_BIAS, say): execute() returns D
            y = mm.execute()
            mm.execute(out=y)                          # into y: no allocation
            mm.execute(algorithm=mm.algorithms[1])     # another planned algorithm, from now on
            side = cupy.cuda.Stream(non_blocking=True)
            mm.execute(stream=side)                    # on another stream, ordered after the last

            # a CUDA graph: one run outside the capture, then capture execute(out=…)
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                stream.begin_capture()
                mm.execute(out=y, stream=stream)
                graph = stream.end_capture()
            graph.launch(stream)
        """
        if not self._planned or self._released:
            self._check_planned()
        if self._several_devices and _cuda.current_device() != self.device:
            with _cuda.on_device(self.device):  # cuBLASLt and our allocations act on the current device
                return self.execute(stream=stream, out=out, algorithm=algorithm, release_workspace=release_workspace)
        stream_h = self.stream if stream is None else stream_handle(stream)
        launch = self._launch
        if algorithm is not None:
            if self._split_form is not None:  # the fused kernel does not run: its choice would be ignored
                raise NvblasltValueError("execute: algorithm: this plan runs the two-call bias-gradient form that "
                                         "autotune(search=True) chose; plan() again to run one fused algorithm")
            algorithm = launch.planned_algorithm(algorithm)
            launch.ensure_workspace(algorithm.workspace_size, self._last_stream)
            launch.select(algorithm)
        # The framework's stream only matters where its pool allocates (or on the per-thread default
        # stream); asking CuPy for it costs 0.3 µs, a tenth of execute(out=)'s own time.
        if out is None or self._results.outputs or self._split_form is not None or stream_h == 2:
            result = self._run(stream_h, self._framework_stream(), out)
        else:
            result = self._run(stream_h, stream_h, out)  # nothing allocated: no pool to tell about the stream
        if self._blocking:  # host operands (copied back, which waits) or options.blocking=True
            if self._host:
                c = self._operands["c"]
                in_place = (self._host_operands["c"], c.ptr, c.strides) if self._problem.inplace else None
                result = self._results.to_host(result, self._framework, stream_h, in_place)
            else:
                _cuda.check(cudart.cudaStreamSynchronize(stream_h), "cudaStreamSynchronize")
        if release_workspace and launch.workspace is not None:
            launch.release_workspace()
            self._planned = False  # the next execute needs plan() again, as in nvmath-python
        return result

    def _run(self, stream_h: int, framework_stream: int, out):
        """Make the outputs and launch on ``stream_h``: the hot path, no checks left."""
        with self._lock:  # one launch at a time: the descriptor's output pointers are set per call
            if stream_h != self._last_stream:
                self._order_after_last_stream(stream_h)
            if self._split_form is not None:
                return self._split_form.run(stream_h, framework_stream, out)
            if out is not None:
                d, d_pointer = out, self._out_checker.pointer(out, stream_h)
            elif self._allocate_result is None:  # in place: D is C
                d, d_pointer = self._operands["c"].obj, self._operands["c"].ptr
            else:
                d, d_pointer = self._allocate_result(stream_h, framework_stream)
            aux = self._results.allocate_outputs(stream_h, framework_stream) if self._results.outputs else None
            self._launch.run(d_pointer, stream_h)
            if stream_h == 2 and framework_stream != 2 and not self._hand_back:
                # results from the framework's pool, used on the per-thread default stream, which the
                # framework cannot be told about: order its stream after ours instead
                _memory.wait_for(stream_h, framework_stream)
        if self._hand_back:  # nvblaslt's own DeviceArrays, handed to JAX / Numba zero-copy
            if out is None and self._allocate_result is not None:
                d = self._framework.hand_back(d)
            if aux is not None:
                aux = {k: self._framework.hand_back(v) for k, v in aux.items()}
        return d if aux is None else (d, aux)

    def _trial_run(self, stream_h: int) -> int:
        """One launch of the selected algorithm with D and every epilog output in the plan's scratch
        memory, never in the caller's arrays (an in-place c is read, not written): the launches that
        autotune and the search time. Raises on a refusal. Returns where D was written."""
        with self._lock:
            if stream_h != self._last_stream:
                self._order_after_last_stream(stream_h)
            d_pointer = self._results.scratch(self._operands["c"], stream_h)
            self._launch.try_run(d_pointer, stream_h)
        return d_pointer

    def _order_after_last_stream(self, stream_h: int) -> None:
        """The workspace and descriptor are shared by every stream this plan runs on: order the new
        stream after the work queued on the previous one, then remember it for the release."""
        if _cuda.is_capturing(stream_h):
            return  # a graph capture orders nothing outside itself (torch synchronizes before capturing)
        _memory.wait_for(self._last_stream, stream_h)
        self._last_stream = stream_h
        self._results.used_on(stream_h)
        for owned in (self._launch.workspace, self._scales.buffer, *self._staged.values()):
            if owned is not None:
                owned.used_on(stream_h)

    # ---- operands ----------------------------------------------------------------------------------
    def reset_operands(self, a: Array | None = None, b: Array | None = None, c: Array | None = None, *,
                       alpha: ScalarLike | None = None, beta: ScalarLike | None = None,
                       epilog_inputs: dict[str, Any] | None = None, quantization_scales: QuantizationScales = None,
                       stream: Stream | None = None) -> None:
        """Point the plan at new operands, or give it new alpha, beta, epilog inputs or scales.

        nvmath-python's ``reset_operands``: the plan, its algorithms and its workspace stay, and
        the next ``execute()`` reads the new arrays. Each new GPU array is compared with the one
        it replaces; a new host array is copied into the plan's device copy of that operand. The
        reset is all or nothing: everything given is read and checked before the plan changes, so
        a refused reset leaves the plan as it was.

        Parameters
        ----------
        a, b, c : array, optional
            New operands; None keeps the current one. Each must be of the same package and memory
            space as the one it replaces, with the same shape, strides, dtype, device and lazy
            conjugation, and a pointer aligned at least as well (the algorithms were chosen for
            that alignment). A host operand needs the same shape and dtype only (it is copied).
            After ``release_operands()``, every operand the plan had must be given. GPU arrays are
            read in place at each ``execute()``: keep them alive while the plan uses them.
        alpha : number or one-element array, optional
            A new alpha, checked against the plan's scale type.
        beta : number or one-element array, optional
            A new beta; only for a plan with ``c``.
        epilog_inputs : dict, optional
            New arrays for any of the inputs the planned epilog reads (``"bias"``, ``"relu_aux"``,
            ``"gelu_aux"``), each laid out as the one it replaces (dtype, leading dimension,
            batch stride, alignment at least as good); and ``"aux_quantization_scale"``, a new
            scale for an fp8 GELU aux. Needs ``plan()`` first.
        quantization_scales : MatmulQuantizationScales or dict, optional
            New fp8 scales for any of the keys the plan has (``"a"``, ``"b"``, ``"c"``, ``"d"``):
            numbers, or float32 GPU arrays of shape () or (1,).
        stream : int or stream object, optional
            The stream the new arrays are read on and host operands copied on, ordered after the
            work the plan queued last; default the plan's stream. The plan's stream is unchanged.

        Raises
        ------
        NvblasltStateError
            The plan was freed.
        NvblasltValueError
            A new operand differs from the one it replaces (shape, strides, dtype, device,
            conjugation) or is less aligned; ``c`` or ``beta`` for a plan without ``c``; operands
            missing after ``release_operands()``; epilog inputs before ``plan()``, unknown to the
            epilog, or laid out otherwise; scales for keys the plan has none of, or invalid values.
        NvblasltTypeError
            A new operand of another package or memory space, a new epilog input of another
            package, or a value that is not a number (alpha, beta, scales).
        NvblasltArgumentError
            A new epilog input in the other memory space than the plan's operands.
        CudaError
            Copying a host operand to the GPU failed.

        See Also
        --------
        reset_operands_unchecked : the same without comparing new GPU arrays.
        release_operands : drops the references to the operands.

        Examples
        --------
        .. code-block:: python

            with Matmul(x, w) as mm:
                mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
                for batch in batches:                  # arrays shaped and laid out as x
                    mm.reset_operands(a=batch)
                    y = mm.execute()
                mm.reset_operands(alpha=0.5, epilog_inputs={"bias": other_bias})
        """
        self._reset(dict(a=a, b=b, c=c), alpha, beta, epilog_inputs, quantization_scales, stream, True)

    def reset_operands_unchecked(self, a: Array | None = None, b: Array | None = None, c: Array | None = None, *,
                                 alpha: ScalarLike | None = None, beta: ScalarLike | None = None,
                                 epilog_inputs: dict[str, Any] | None = None,
                                 quantization_scales: QuantizationScales = None, stream: Stream | None = None) -> None:
        """``reset_operands`` without comparing the new GPU operands with the old (nvblaslt's addition).

        For hot loops whose caller guarantees that each new GPU array ``a``, ``b``, ``c`` is like
        the one it replaces: same package, memory space, shape, strides, dtype, device and
        lazy conjugation, and a pointer aligned at least as well. Those comparisons are skipped;
        the array is only read for its pointer. Host operands (copied into the plan's device
        copies), a host array given to a GPU plan (refused), epilog inputs, alpha, beta and scales
        are checked as by ``reset_operands``.

        Parameters
        ----------
        a, b, c : array, optional
            New operands, each like the one it replaces (unchecked for GPU operands); None keeps
            the current one. After ``release_operands()``, every operand the plan had must be
            given.
        alpha, beta : number or one-element array, optional
            New scalars, as for ``reset_operands``.
        epilog_inputs : dict, optional
            New epilog inputs or fp8 aux scale, checked as by ``reset_operands``.
        quantization_scales : MatmulQuantizationScales or dict, optional
            New fp8 scales, checked as by ``reset_operands``.
        stream : int or stream object, optional
            As for ``reset_operands``.

        Raises
        ------
        NvblasltStateError
            The plan was freed.
        NvblasltValueError, NvblasltTypeError
            As ``reset_operands`` raises them, less the comparisons of new GPU operands; an
            object that is no array.

        Warnings
        --------
        A GPU operand that is not like the one it replaces is not detected: the next
        ``execute()`` reads (and writes) memory as the plan's layout says, which gives wrong
        results or faults. Use ``reset_operands`` unless the arrays are known to match.

        See Also
        --------
        reset_operands : the checked form.

        Examples
        --------
        .. code-block:: python

            buffers = [cupy.empty_like(x) for _ in range(2)]   # like x: same layout and alignment
            for i, batch in enumerate(batches):
                buffers[i % 2][...] = batch
                mm.reset_operands_unchecked(a=buffers[i % 2])
                y = mm.execute()
        """
        self._reset(dict(a=a, b=b, c=c), alpha, beta, epilog_inputs, quantization_scales, stream, False)

    def _reset(self, new: dict, alpha, beta, epilog_inputs, quantization_scales, stream, checked: bool) -> None:
        self._check_alive()
        stream_h = self.stream if stream is None else stream_handle(stream)
        with _cuda.on_device(self.device):
            self._take_reset(new, alpha, beta, epilog_inputs, quantization_scales, stream_h, checked)

    def _take_reset(self, new: dict, alpha, beta, epilog_inputs, quantization_scales, stream_h: int,
                    checked: bool) -> None:
        # Everything is read and checked first; the plan changes only once nothing can refuse, so a refused
        # reset leaves it pointing at the operands it had.
        operands = _reading.read_reset(new, self._operands, self._host_operands, self._released, self._framework,
                                       self._host, stream_h, checked)
        given, aux_scale = _epilogs.split_aux_scale(epilog_inputs)
        if (given or aux_scale is not None) and not self._planned:
            raise NvblasltValueError("epilog_inputs: call plan() before resetting epilog inputs")
        dropped = sorted(key for key in self._input_operands if f"epilog_inputs['{key}']" in (self._released or ())
                         and key not in given)
        if dropped:  # their pointers are still bound: the arrays they point to may be gone
            raise NvblasltValueError(f"epilog_inputs: release_operands() dropped the epilog inputs {dropped} too; give "
                                     f"them again with the operands")
        inputs = _reading.read_reset_inputs(given, self._planned, self._epilog, self._prepared.inputs,
                                            self._input_operands, self._problem, self._host, stream_h) \
            if given else {}
        scales = self._scales.check(quantization_scales, self.stream, on_reset=True) \
            if quantization_scales is not None else {}
        if aux_scale is not None:
            scales.update(self._scales.check_aux(aux_scale, self.stream))
        if beta is not None and self._operands["c"] is None:
            raise NvblasltValueError("beta: the plan has no c for beta to scale")
        for value, argument in ((alpha, "alpha"), (beta, "beta")):
            if value is not None:
                Scalar(self._problem_operands.types.scale, argument).set(value)  # refuses what the plan's own would
        # Commit. Copies into device memory a queued kernel may still read wait for the last stream's work.
        if self._last_stream != stream_h and not _cuda.is_capturing(stream_h):
            _memory.wait_for(self._last_stream, stream_h)
        self._released = None
        for name, op in operands.items():
            if op.host:  # into the device copy's layout
                old = self._operands[name]
                self._host_operands[name] = op
                _host.refresh(op, old.ptr, old.strides, stream_h)
                op = _operands.Operand(op.obj, old.ptr, op.shape, old.strides, op.dtype, self.device, op.readonly,
                                       op.kind)
            self._operands[name] = op
        for key, (op, entry) in inputs.items():
            if entry is None:  # a host input: into its device copy's layout
                staged = self._input_operands[key]
                _host.refresh(op, staged.ptr, staged.strides, stream_h)
                continue
            self._prepared.inputs[key] = entry
            self._input_operands[key] = op
            self._input_setters[key](entry.ptr)
        if scales:  # new values replace the old for the keys given (numbers or arrays alike)
            if self._last_stream != self.stream:
                _memory.wait_for(self._last_stream, self.stream)
            self._scales.write(scales, self.stream)
            if self._planned:
                for attribute, pointer in self._scales.descriptor_pointers(self._problem).items():
                    self._launch.desc.set(attribute, pointer)
                if "aux" in scales:
                    self._launch.desc.set("EPILOGUE_AUX_SCALE_POINTER", self._scales.pointer("aux"))
        if alpha is not None:
            self._alpha.set(alpha)
        if beta is not None:
            self._beta.set(beta)
        self._fast_bound = None
        if self._planned:
            self._out_checker.forget()  # a new operand may overlap an out= checked before
            self._bind()
        if self._split_form is not None:  # its first plan reads what this one now reads (host: the device copies)
            self._split_form.main._set_operands(*self._operands.values(), dict(self._input_operands),
                                                self._alpha.value, self._beta.value)

    def release_operands(self) -> None:
        """Drop the plan's references to the caller's arrays (nvmath-python's ``release_operands``).

        The operands, their host originals, the epilog inputs and any scale arrays are no longer
        kept alive by the plan, so their memory can be freed while the plan (descriptors,
        algorithms, workspace) stays. ``execute()`` and ``autotune()`` then raise
        ``NvblasltStateError`` until ``reset_operands()`` (or ``reset_operands_unchecked()``)
        gives every operand the plan had (``a``, ``b`` and ``c`` if it has one) again.

        Raises
        ------
        NvblasltStateError
            The plan was freed.

        Notes
        -----
        Only ``a``, ``b`` and ``c`` must be given again: the epilog inputs and scale arrays the
        plan was given stay bound by address. If their memory is freed after this call, give new
        ones with ``reset_operands(epilog_inputs=…, quantization_scales=…)`` before executing.

        Examples
        --------
        .. code-block:: python

            mm.release_operands()                      # x and w may be freed now
            del x, w
            mm.reset_operands(a=new_x, b=new_w)        # every operand again
            y = mm.execute()
        """
        self._check_alive()
        self._forget_arrays()
        self._released = {name for name, op in self._operands.items() if op is not None}
        self._released.update(f"epilog_inputs['{key}']" for key in self._input_operands)

    def _set_operands(self, a, b, c, inputs: dict, alpha, beta) -> None:
        """The function form's checked path on a cache hit: the key already matched every check."""
        self._operands["a"], self._operands["b"], self._operands["c"] = a, b, c
        self._out_checker.forget()  # a new a, b or c may overlap an out= checked before
        if self._split_form is not None:
            self._split_form.main._set_operands(a, b, c, inputs, alpha, beta)
        self._rebind([a.ptr, b.ptr, c.ptr if c is not None else None, *(op.ptr for op in inputs.values())],
                    tuple(inputs), alpha, beta)

    def _rebind(self, pointers: list, input_names: tuple, alpha, beta, *, keep: bool = False) -> None:
        """The function form's fast path: new pointers for a, b, c, then the named epilog inputs. ``keep``:
        remember ``pointers`` as bound (``fast_bound``: the same arrays next time need no rebinding)."""
        self._fast_bound = None  # until this binding is complete
        launch = self._launch
        if self._swapped:  # the transposed problem: cuBLASLt's A is the caller's B
            launch.a_pointer.value, launch.b_pointer.value = pointers[1], pointers[0]
        else:
            launch.a_pointer.value, launch.b_pointer.value = pointers[0], pointers[1]
        if pointers[2] is not None and launch.c_pointer is not None:
            launch.c_pointer.value = pointers[2]
        if input_names:
            inputs = self._prepared.inputs
            for key, pointer in zip(input_names, pointers[3:]):
                given = inputs.get(key)  # None: an input this epilog does not take (warned about, ignored)
                if given is not None and pointer != given.ptr:
                    self._input_setters[key](pointer)
                    inputs[key] = dataclasses.replace(given, ptr=pointer)
        # plain numbers equal to the last ones skip the write; anything else is checked by set()
        if type(alpha) not in _NUMBERS or type(beta) not in _NUMBERS or alpha != self._alpha.value \
                or beta != self._beta.value:
            self._alpha.set(alpha)
            self._beta.set(beta)
        if self._split_form is not None:  # the two-call form runs instead: its first plan takes the operands
            self._split_form.main._rebind(pointers, input_names, alpha, beta)
        self._fast_bound = pointers if keep else None

    def _bind(self) -> None:
        """Point the launch at the current operands (cuBLASLt's A is the caller's B when transposed)."""
        problem, operands = self._problem, self._operands
        self._swapped = problem.a.source == "b"
        c = operands["c"]
        self._launch.bind(operands[problem.a.source].ptr, operands[problem.b.source].ptr,
                         c.ptr if c is not None else None)
        self._fast_bound = None

    def _forget_arrays(self) -> None:
        """Drop every reference to the caller's arrays (pointers and layouts stay): the operands as
        read, their host originals, the epilog inputs, and the first operands the problem was read from."""
        first = self._problem_operands
        held = [*self._operands.values(), *self._host_operands.values(), *self._input_operands.values(),
                first.a.op, first.b.op, first.c.op if first.c is not None else None]
        for op in held:
            if op is not None:
                op.obj = None
        self._scales.forget_arrays()
        if self._split_form is not None:
            self._split_form.main._forget_arrays()

    # ---- lifetime ----------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._freed:
            raise NvblasltStateError("this Matmul was freed; make a new one")

    def _check_planned(self) -> None:
        self._check_alive()
        if self._released:
            raise NvblasltStateError("execute: cannot be performed after the operands have been released by "
                                     "release_operands(); call reset_operands() with new operands first")
        if not self._planned:
            raise NvblasltStateError("execute/autotune: call plan() first")

    def _release_plan(self) -> None:
        if self._split_form is not None:  # the two-call form of this plan
            self._split_form.free()
            self._split_form = None
        if self._launch is not None:
            self._launch.close()
            self._results.release()

    def free(self) -> None:
        """Release the plan's descriptors and device memory (nvmath-python's ``free``).

        The workspace, the scratch memory, the scale buffer and the device copies of host
        operands are released stream-ordered, after the work already queued with them, so
        ``free()`` does not wait for the GPU. The references to the caller's arrays are dropped;
        results already returned stay valid. Calling it again does nothing; ``plan()``,
        ``autotune()``, ``execute()``, the operand resets and ``applicable_algorithm_ids()`` then
        raise ``NvblasltStateError``. Leaving a ``with Matmul(…)`` block calls it.

        Examples
        --------
        .. code-block:: python

            mm = Matmul(a, b)
            try:
                mm.plan()
                y = mm.execute()
            finally:
                mm.free()                              # or: with Matmul(a, b) as mm: …
        """
        if not self._freed:
            with self._lock:
                self._release_plan()
                for owned in (self._scales.buffer, *self._staged.values()):
                    if owned is not None:
                        owned.release()
                self._forget_arrays()
                self._planned = False
                self._freed = True

    def __enter__(self) -> Matmul[ResultT]:
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        state = "freed" if self._freed else (self._epilog.name if self._planned else "not planned")
        return f"<Matmul {self._problem_operands.describe()} {state}>"


if TYPE_CHECKING:
    def _meets_the_declared_interface(plan: Matmul) -> tuple[PlanInternals, TunedPlan]:
        return plan, plan  # mypy reads Matmul against what the package calls on it


__all__ = ["Matmul", "MatmulOptions", "MatmulPlanPreferences", "OP_N", "OP_T"]
