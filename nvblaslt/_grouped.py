"""``GroupedMatmul``: one cuBLASLt call for every group of a ragged split (mixture-of-experts layers).

It has ``torch._grouped_mm``'s semantics (``_grouped_problem`` lists the four forms) on any GPU
arrays, and returns the result in the operands' package; ``grouped_matmul`` (``_grouped_function``)
is the function form. A plan is made once per (groups, extents but the ragged one, dtypes, layout,
alignment) and runs again with new operands and new offsets, which never leave the GPU: each
``execute`` queues a small kernel (``_grouped_arrays``) that writes cuBLASLt's per-group arrays,
then the GEMM, with no host synchronization, so it can be captured in a CUDA graph.

Each plan owns its arrays and one ``Launch`` (``_launch``), the same owner of ``cublasLtMatmul`` as
``Matmul``'s: heuristics, cuBLASLt's check, the selected algorithm and its fallback when refused at
launch, the workspace and the prebuilt arguments, with the arrays of per-group pointers in fixed
argument slots. Each plan owns its workspace and arrays. A plan used from another stream than last time makes that
stream wait for the earlier work first, so two streams never share them at once; a CUDA graph's
replays are the caller's to order with eager use of the plan it captured (``grouped_matmul`` gives
such a plan up and makes a new one for later eager calls).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _cuda, _dtypes, _grouped_problem, _grouped_tuning, _memory, _operands, _tuning_cache
from ._tuning_result import TuningReport
from ._descriptors import GroupedMatrixLayout, Handle, HeuristicResult, MatmulDesc, MatmulPreference
from ._errors import CublasLtError, NvblasltStateError, NvblasltTypeError, NvblasltValueError
from ._frameworks import fast_reader
from ._grouped_arrays import GroupedArrays
from ._grouped_version import require_grouped
from ._grouped_problem import GroupedProblem
from ._hints import Array, Stream
from ._launch import Launch
from ._loader import library
from ._plan_cache import PlanCaches
from ._streams import stream_handle
from ._strides import extent_bytes, span_elements

if TYPE_CHECKING:
    from ._protocols import GroupedPlanInternals

WORKSPACE_BYTES = 32 << 20  # what cuBLASLt's grouped kernels on Hopper ask for, with room
_MAX_PLANS = 64
_FAST_LIMIT = 16  # execute()'s layout keys per plan (token totals that vary without end start it afresh)
_ENV_CHECK = "NVBLASLT_CHECK_OFFSETS"


def _check_offsets_default() -> bool:
    return os.environ.get(_ENV_CHECK, "") not in ("", "0")


def stream_of(a: Any, stream: Any) -> int:
    """``stream``'s handle, or the current stream of ``a``'s package on its device. A host array (a CPU
    tensor) has none to ask, and a CPU-only package cannot answer: 0, and ``bind`` refuses the array by name."""
    if stream is not None:
        return stream_handle(stream)
    if a is None or _operands.is_host_array(a):
        return 0
    return _operands.framework_of(a).stream_of(a)


@dataclass(frozen=True)
class Bound:
    """Operands read for one call (``a``, ``b``, ``offs`` as ``Operand``s) and the problem they pose."""

    problem: GroupedProblem
    operands: tuple


def bind(a: Array | None, b: Array | None, offs: Array | None, stream: int, out_dtype: _dtypes.DType | None = None,
         defaults: tuple = (None, None, None)) -> Bound:
    """Read the operands (each default ``defaults``' where not given), all on one device, and describe them."""
    for name, given, default in (("a", a, defaults[0]), ("b", b, defaults[1])):
        if given is None and default is None:
            raise NvblasltTypeError(f"{name}: expected an array on the GPU, got None")
    a_op = _read(a, "a", stream) if a is not None else defaults[0]
    b_op = _read(b, "b", stream) if b is not None else defaults[1]
    offs_op = _read(offs, "offs", stream) if offs is not None else defaults[2]
    for name, op in (("b", b_op), ("offs", offs_op)):
        if op is not None and op.device != a_op.device:
            raise NvblasltValueError(f"{name}: expected an array on device {a_op.device} (a's), got device "
                                     f"{op.device}")
    # the derive kernel reads offs[g] at g elements from the start: strided offsets would be misread
    if offs_op is not None and len(offs_op.shape) == 1 and offs_op.shape[0] > 1 and offs_op.strides[0] != 1:
        raise NvblasltValueError(f"offs: expected contiguous offsets (stride 1), got {offs_op.describe()}")
    return Bound(_grouped_problem.describe(a_op, b_op, offs_op, out_dtype=out_dtype), (a_op, b_op, offs_op))


def _read(obj: Array, name: str, stream: int) -> _operands.Operand:
    op = _operands.read(obj, name, stream)
    if op.host:
        raise NvblasltValueError(f"{name}: expected an array on the GPU (grouped GEMM reads offsets on the device "
                                 f"and never stages host arrays), got a host {op.describe()}")
    return op


def read_scales(scale_a: Array | None, scale_b: Array | None, problem: GroupedProblem, device: int,
                stream: int) -> tuple[int, int]:
    """The device pointers of ``a``'s and ``b``'s per-tensor scales (0: none, a scale of 1), checked: one
    float32 value on the operands' GPU each, for fp8 operands only."""
    pointers = []
    for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
        if scale is None:
            pointers.append(0)
            continue
        if not problem.fp8:
            raise NvblasltValueError(f"{name}: per-tensor scales apply to float8 operands; these are "
                                     f"{problem.b.dtype.name}")
        op = _read(scale, name, stream)
        if op.dtype != _dtypes.FLOAT32 or math.prod(op.shape) != 1 or op.device != device:
            raise NvblasltValueError(f"{name}: expected one float32 value on GPU {device} (a per-tensor scale, "
                                     f"shape () or (1,)), got {op.describe()}")
        pointers.append(op.ptr)
    return pointers[0], pointers[1]


class GroupedMatmul:
    """A grouped GEMM plan: ``out_g = a_g · b_g`` for every group, in one cuBLASLt call.

    Parameters
    ----------
    a, b : arrays on the GPU
        2-D or 3-D as ``torch._grouped_mm`` takes them (``grouped_matmul`` lists the forms and dtypes):
        bfloat16 or float16, or fp8 (float8_e4m3fn, or float8_e5m2 in one of the two).
    offs : 1-D int32 or int64 GPU array, optional
        The groups' cumulative ends along the ragged extent; None for 3-D × 3-D.
    out_dtype : dtype, optional
        The operands' dtype (default) or float32; for fp8 operands bfloat16 (default), float16 or float32.
    stream : int or stream object, optional
        Where the plan's memory is made; default the operands' package's current stream.
    workspace_bytes : int, optional
        The most workspace an algorithm may use (default 32 MiB).

    Attributes
    ----------
    tuning_report : TuningReport
        Set by ``autotune()``: what it chose and how sure it is (``print`` it); None once another
        algorithm is selected.
    device : int
        The GPU the plan runs on (the operands').

    Raises
    ------
    NvblasltUnsupportedError
        The loaded cuBLASLt is older than 13.4, or a dtype grouped GEMM does not run.
    NvblasltTypeError, NvblasltValueError
        An operand of the wrong kind, dtype or shape; host arrays.

    Examples
    --------
    .. code-block:: python

        plan = nvblaslt.GroupedMatmul(tokens, experts.transpose(1, 2), offs)   # experts: (G, N, K)
        plan.plan()
        for tokens, offs in batches:                  # new token counts and offsets reuse the plan
            hidden = plan.execute(tokens, experts.transpose(1, 2), offs)
        plan.free()
    """

    def __init__(self, a: Array, b: Array, offs: Array | None = None, *, out_dtype: Any = None,
                 stream: Stream | None = None,
                 workspace_bytes: int = WORKSPACE_BYTES):
        stream_h = stream_of(a, stream)
        self._out_dtype = _dtypes.parse(out_dtype, "out_dtype") if out_dtype is not None else None
        bound = bind(a, b, offs, stream_h, self._out_dtype)
        self._lib = library()
        require_grouped(self._lib)
        self._problem = bound.problem
        self._operands: tuple | None = bound.operands
        # execute()'s defaults as given (a, b, offs); _operands is None where the last call took the fast path,
        # which reads no Operand: read again from these when the checked path or autotune needs them
        self._given: tuple = tuple(None if op is None else op.obj for op in bound.operands)
        # execute()'s fast path: a layout key (each array's shape, strides, dtype, device, pointer alignment, as
        # the package's layout reader gives them) a checked call passed -> (the problem, 64-bit offsets, the bytes
        # a, b and offs span, then the result's: out must overlap none of them)
        self._fast: dict[tuple, tuple[GroupedProblem, bool, tuple[int, ...]]] = {}
        # (the key found last, what it names), compared first: one attribute, so a thread sharing the plan never
        # reads one call's key with another's problem
        self._fast_hit: tuple[tuple | None, tuple[GroupedProblem, bool, tuple[int, ...]] | None] = (None, None)
        self._captured = False  # a CUDA graph holds this plan's arrays and workspace: they must outlive it
        a_op = bound.operands[0]
        self.device, self._framework = a_op.device, a_op.framework
        self._last_stream = stream_h
        self._workspace_bytes = workspace_bytes
        self.tuning_report: TuningReport | None = None  # what the last autotune() chose, over what, how sure
        # what _check() accepted within the workspace limit, by the algorithm's bytes: select() takes them too
        self._checked: dict[bytes, HeuristicResult] = {}
        self._freed = False
        self._allocators: dict[tuple[int, ...], Any] = {}  # result shape -> allocate
        self._lock = threading.Lock()
        self._scales = (0, 0)  # the per-tensor scale pointers the descriptor holds (fp8)
        self._several_devices = _cuda.several_devices()
        # read once, here: an environment read costs about 1 µs, every call (plans made after a change see it)
        self._check_offsets_default = _check_offsets_default()
        with _cuda.on_device(self.device):
            if _cuda.is_capturing(stream_h):
                raise NvblasltStateError("stream: a CUDA graph is being captured on it; make the grouped plan "
                                         "before the capture (planning allocates device memory)")
            self._arrays = GroupedArrays(self._problem, self.device, stream_h)
            desc, layouts, preference = self._descriptors()
            # beta is 0: C is D's layout and D's pointers
            self._d_array = self._arrays.pointer_array(2)
            self._launch = Launch.given(self._lib, Handle.for_device(self.device), desc, layouts, preference,
                                        workspace_limit=workspace_bytes, device=self.device,
                                        pointers=(self._arrays.pointer_array(0), self._arrays.pointer_array(1),
                                                  self._d_array), description=self._describe())

    @classmethod
    def _cached(cls, a: Array, b: Array, offs: Array | None, out_dtype: Any) -> tuple[GroupedMatmul, GroupedProblem]:
        """``grouped_matmul``'s plan in this thread for these operands (made and cached where there is none),
        and their problem: the torch layer's bound calls run it, so one plan serves both and
        ``clear_grouped_plans()`` frees it."""
        stream_h = stream_of(a, None)
        cache = function_plans.plans
        if cache.generation != _tuning_cache.generation:  # a search stored a choice since
            cache.retire_tuned(lambda: stream_h)
        dtype = _dtypes.parse(out_dtype, "out_dtype") if out_dtype is not None else None
        bound = bind(a, b, offs, stream_h, dtype)
        return cached_plan(bound, a, b, offs, dtype, stream_h)[0], bound.problem

    # ---- the launch's algorithms, read through the plan -------------------------------------------------
    @property
    def algorithms(self) -> list[HeuristicResult]:
        """The planned algorithms, best first (autotune's timed order once it has run)."""
        return self._launch.algorithms

    @property
    def algorithm(self) -> HeuristicResult | None:
        """The algorithm ``execute`` runs; None before ``plan()`` and after ``free()``."""
        return None if self._freed else self._launch.algorithm

    def _descriptors(self):
        problem, api, arrays = self._problem, self._lib.api, self._arrays
        desc = MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F, lib=self._lib)
        desc.set("TRANSA", int(api.CUBLAS_OP_T if problem.transa else api.CUBLAS_OP_N))
        desc.set("TRANSB", int(api.CUBLAS_OP_T if problem.transb else api.CUBLAS_OP_N))

        def layout(index: int, dtype) -> GroupedMatrixLayout:
            return GroupedMatrixLayout(int(getattr(api, dtype.cuda)), problem.groups, arrays.array(index, 0),
                                       arrays.array(index, 1), arrays.array(index, 2), lib=self._lib)
        a = layout(0, problem.a.dtype)
        b = layout(1, problem.b.dtype)
        d = layout(2, problem.d.dtype)
        c = layout(2, problem.d.dtype)  # beta is 0: C is D's layout and D's pointers
        preference = MatmulPreference(max_workspace_bytes=self._workspace_bytes, lib=self._lib)
        for key, matrix in (("A", problem.a), ("B", problem.b), ("C", problem.d), ("D", problem.d)):
            preference.set(f"MIN_ALIGNMENT_{key}_BYTES", matrix.alignment)
        k, rows, cols = problem.average
        preference.set("GROUPED_AVERAGE_REDUCTION_DIM", k)
        preference.set("GROUPED_DESC_D_AVERAGE_ROWS", rows)
        preference.set("GROUPED_DESC_D_AVERAGE_COLS", cols)
        return desc, [a, b, c, d], preference

    def plan(self, *, limit: int = 8, algorithm: HeuristicResult | None = None) -> list[HeuristicResult]:
        """Ask cuBLASLt's heuristics for algorithms and select one; make the workspace it needs.

        Parameters
        ----------
        limit : int, optional
            The most algorithms to ask for (default 8).
        algorithm : HeuristicResult, optional
            One of those returned, to select instead of the first.

        Returns
        -------
        list of HeuristicResult
            The algorithms, best first (also ``algorithms``).

        Raises
        ------
        CublasLtError
            ``CUBLAS_STATUS_NOT_SUPPORTED``: cuBLASLt has no grouped algorithm for the problem on this GPU.
        """
        found = self._launch.heuristics(limit)
        if found and algorithm is None:
            tuned, _ = _tuning_cache.recall(self._launch)  # what an earlier autotune() chose for this problem
            if tuned is not None:
                found = [tuned, *(r for r in found if r.as_bytes() != tuned.as_bytes())]
        if not found:
            status = int(self._lib.api.CUBLAS_STATUS_NOT_SUPPORTED)
            raise CublasLtError("cublasLtMatmulAlgoGetHeuristic", status, self._lib.status_name(status),
                                self._lib.status_string(status),
                                f"cuBLASLt has no grouped algorithm for {self._describe()} on this GPU")
        self._launch.offer(found)
        self._freed = False
        self.tuning_report = None  # of the algorithms planned before
        self.select(algorithm if algorithm is not None else found[0])
        return found

    def select(self, algorithm: HeuristicResult) -> None:
        """Run ``algorithm`` from now on, its workspace made if larger than the one held.

        Parameters
        ----------
        algorithm : HeuristicResult
            One of ``algorithms`` (what ``plan()`` returned), or one cuBLASLt's check accepts for this plan.

        Raises
        ------
        NvblasltTypeError
            ``algorithm`` is not a HeuristicResult.
        NvblasltValueError
            cuBLASLt's check refuses it for this plan, or it needs more workspace than the plan allows.
        """
        as_bytes = getattr(algorithm, "as_bytes", None)
        wanted = as_bytes() if callable(as_bytes) else None
        if not isinstance(wanted, bytes) or len(wanted) != ctypes.sizeof(self._lib.api.cublasLtMatmulAlgo_t):
            raise NvblasltTypeError(f"algorithm: expected a HeuristicResult (plan() returns them), got "
                                    f"{type(algorithm).__name__}")
        # the plan's own result (what cuBLASLt said of it here: its workspace), not the caller's copy
        own = next((r for r in self.algorithms if algorithm is r or wanted == r.as_bytes()), None) \
            or self._checked.get(wanted) or self._check(self._lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(wanted))
        if own is None or own.workspace_size > self._workspace_bytes:
            raise NvblasltValueError("algorithm: expected one of this plan's algorithms (plan() returns them) or one "
                                     "cuBLASLt's check accepts within its workspace limit")
        self._ensure_workspace(own.workspace_size)
        if own is not self.algorithm:
            self.tuning_report = None  # it describes another algorithm's choice
        self._launch.select(own)

    def _ensure_workspace(self, nbytes: int, stream: int | None = None) -> None:
        """A workspace of at least ``nbytes``, made on ``stream`` (default the plan's last one) if larger
        than the one held; a failed allocation leaves the plan whole, on the old one."""
        self._launch.ensure_workspace(nbytes, self._last_stream if stream is None else stream)

    def _check(self, algo: Any) -> HeuristicResult | None:
        """``algo`` (a ``cublasLtMatmulAlgo_t``) as cuBLASLt accepts it for this plan, or None."""
        checked = self._launch.check(algo)
        if checked is None:
            return None
        key = checked.as_bytes()
        if checked.workspace_size <= self._workspace_bytes:  # what select() then takes (the search's candidates)
            self._checked.pop(key, None)  # stored anew: the newest
            if len(self._checked) >= 4096:  # the oldest goes first (select() checks an evicted one again)
                del self._checked[next(iter(self._checked))]
            self._checked[key] = checked
        return checked

    def autotune(self, *, iterations: int = 5, search: bool = False, budget_s: float | None = None,
                 remember: bool = True) -> list[tuple[HeuristicResult, float]]:
        """Time the planned algorithms on the plan's last operands and select the fastest; with
        ``search``, also look beyond them.

        ``Matmul.autotune``'s engine: each algorithm runs once to warm up, then ``iterations`` times in
        shuffled interleaved rounds, timed with CUDA events (L2 flushed before each run), the derive
        kernel included; the lowest median wins. With ``search=True`` it then screens what the
        heuristics did not return (their deeper ranking, cluster-shape and swizzle variants, every
        algorithm id and tile cuBLASLt's check accepts for these grouped layouts) within ``budget_s``,
        and switches only to a challenger faster than autotune's pick beyond the measured noise (a sign
        test over paired rounds). The timed runs write into scratch memory, never the caller's arrays.
        Waits for the GPU.

        Parameters
        ----------
        iterations : int, optional
            Timed runs of each algorithm (default 5).
        search : bool, optional
            Also search beyond the heuristics' list (default False).
        budget_s : float, optional
            Seconds a search may take (default about 10).
        remember : bool, optional
            Store the choice in the tuning cache (default), where ``plan()`` of the same problem finds
            it, in this process and later ones.

        Returns
        -------
        list of (HeuristicResult, float)
            ``(algorithm, median milliseconds)``, the selected one first, then the others timed, fastest
            first. ``tuning_report`` says what was chosen over what, and how sure (``print`` it).

        Raises
        ------
        NvblasltStateError
            Before ``plan()``, after ``release_operands()``, or while a CUDA graph is captured on the stream.
        NvblasltValueError
            ``iterations`` is not a positive int, or ``budget_s`` not a positive number.
        """
        _grouped_tuning.check_arguments(iterations, budget_s)
        if not self.algorithms or self.algorithm is None:
            raise NvblasltStateError("autotune: plan() first: there are no algorithms to time")
        if self._given[0] is None or self._given[1] is None:
            raise NvblasltStateError("autotune: the plan's operands were released (release_operands); execute() "
                                     "with operands first")
        stream = self._last_stream
        self._operands = self._kept_operands(stream)
        bound = bind(None, None, None, stream, self._out_dtype, defaults=self._operands)
        return self._apply_tuning(_grouped_tuning.autotune(self, bound, stream, iterations=iterations, search=search,
                                                          remember=remember, budget_s=budget_s))

    def _apply_tuning(self, result) -> list[tuple[HeuristicResult, float]]:
        """Run what ``autotune`` chose (a ``TuningResult``): its algorithm, then the planned ones cuBLASLt
        ran in timed order (a searched winner joins them, the other candidates screened do not), and its
        report. Returns the timings, the selected algorithm first."""
        launch = self._launch
        launch.select(result.chosen)
        launch.keep(result.ordered(launch.algorithms), None)
        self.tuning_report = result.report
        return result.timings

    def _describe(self) -> str:
        p = self._problem
        return (f"{p.groups} groups ({p.form}, ragged {p.ragged or 'none'}), {p.b.dtype.name} → {p.d.dtype.name}, "
                f"transa={p.transa}, transb={p.transb}")

    def execute(self, a: Array | None = None, b: Array | None = None, offs: Array | None = None, *,
                out: Array | None = None, stream: Stream | None = None, check_offsets: bool | None = None,
                scale_a: Array | None = None, scale_b: Array | None = None) -> Array:
        """Run the plan on new operands and offsets, returning the result; nothing waits for the GPU.

        Parameters
        ----------
        a, b, offs : arrays, optional
            New operands and offsets (each default: the last ones). They must match the plan in
            everything but the ragged extent's total, their pointers aligned as the plan's were.
        out : array, optional
            Where the result goes: the result's shape and dtype, row-major with every row starting on
            16 bytes (contiguous where a row is a multiple of 16 bytes); default a new array.
        stream : int or stream object, optional
            Default: the operands' package's current stream.
        check_offsets : bool, optional
            Wait for the GPU and refuse offsets out of order, out of range, or not ending at the
            operand's extent (default ``$NVBLASLT_CHECK_OFFSETS``, read when the plan was made): a
            debugging aid.
        scale_a, scale_b : arrays, optional
            fp8 operands' per-tensor scales: one float32 value each on the GPU, read there when the
            GEMM runs (``out = scale_a · scale_b · a_g · b_g``); default 1.

        Returns
        -------
        array
            The result, in the operands' package (``out`` if given).
        """
        given = self._given
        first = a if a is not None else given[0]
        path = fast_reader(first) if first is not None else None
        found = fast_key = entry = None
        if path is not None:  # CuPy / PyTorch: layouts read straight off the arrays, no DLPack export
            arrays = (first, b if b is not None else given[1], offs if offs is not None else given[2], scale_a,
                      scale_b, out)
            try:
                found = path[1](arrays)
                if found is not None:
                    fast_key = found[1]
                    last_key, last_entry = self._fast_hit
                    entry = last_entry if fast_key == last_key else self._fast.get(fast_key)
                    if entry is not None:
                        self._fast_hit = (fast_key, entry)
            except Exception:  # noqa: BLE001 - an odd array or argument: the checked path says what is wrong
                found = fast_key = entry = None
            if found is not None and entry is not None:
                pointers, layouts = found
                self._given, self._operands = arrays[:3], None  # the next call's defaults, read only if needed
                return self._run_pointers(entry[0], pointers[0], pointers[1], pointers[2] or 0, entry[1], out=out,
                                          out_pointer=pointers[5], spans=entry[2], check_offsets=check_offsets,
                                          stream=path[2](layouts[0][3]) if stream is None else stream_handle(stream),
                                          scales=(pointers[3] or 0, pointers[4] or 0))
        result, bound = self._checked_execute(a, b, offs, out, stream, check_offsets, scale_a, scale_b)
        if fast_key is not None:  # every check passed on arrays of these layouts: the next like call skips them
            if len(self._fast) >= _FAST_LIMIT:
                self._fast.clear()
            offs_op = bound.operands[2]
            self._fast[fast_key] = (bound.problem, offs_op is not None and offs_op.dtype == _dtypes.INT64,
                                    operand_spans(bound))
        return result

    def _checked_execute(self, a, b, offs, out, stream, check_offsets, scale_a, scale_b) -> tuple[Array, Bound]:
        """``execute`` with every array read and checked (the first call of a layout, or a package with no
        layout reader)."""
        given = self._given
        missing = [name for name, new, kept in zip(("a", "b", "offs"), (a, b, offs), given)
                   if new is None and kept is None and not (name == "offs" and self._problem.form == "3d3d")]
        if missing:
            raise NvblasltStateError(f"{', '.join(missing)}: expected arrays: the plan's were released "
                                     f"(release_operands), so execute must be given them")
        first = a if a is not None else given[0]
        stream_h = stream_of(first, stream)
        bound = bind(a, b, offs, stream_h, self._out_dtype, defaults=self._kept_operands(stream_h, (a, b, offs)))
        if bound.problem.key != self._problem.key:
            raise NvblasltValueError(
                f"a, b, offs: expected operands this plan was made for ({self._describe()}, alignment "
                f"{self._problem.b.alignment}/{self._problem.a.alignment} bytes), got ones that differ in more than "
                f"the ragged extent; make a new plan (grouped_matmul keeps one per problem)")
        scales = read_scales(scale_a, scale_b, bound.problem, self.device, stream_h)
        result = self.run(bound, out=out, stream=stream_h, check_offsets=check_offsets, scales=scales)
        self._operands = bound.operands  # the defaults of the next execute
        self._given = tuple(None if op is None else op.obj for op in bound.operands)
        return result, bound

    def _kept_operands(self, stream: int, given: tuple = (None, None, None)) -> tuple:
        """The last execute's operands as ``Operand``s, read again where that call took the fast path (those
        replaced by arrays in ``given`` are not read: None in their place)."""
        if self._operands is not None:
            return self._operands
        return tuple(None if kept is None or new is not None else _read(kept, name, stream)
                     for kept, new, name in zip(self._given, given, ("a", "b", "offs")))

    def release_operands(self) -> None:
        """Drop the plan's references to its last operands (``execute`` must then be given them)."""
        self._operands = self._given = (None, None, None)

    def run(self, bound: Bound, *, out: Array | None, stream: int, check_offsets: bool | None,
            scales: tuple[int, int] = (0, 0), trial: bool = False) -> Array:
        """``execute`` for operands already read and known to fit this plan (``grouped_matmul``'s path).

        Parameters
        ----------
        bound : Bound
            What ``bind`` returned for the operands.
        out, check_offsets
            As for ``execute``.
        stream : int
            The stream's handle.
        scales : (int, int)
            Device pointers of ``a``'s and ``b``'s per-tensor scales (``read_scales``); 0 for none.
        trial : bool
            A tuning run: the selected algorithm or an error, never the next one where cuBLASLt refuses it.

        Returns
        -------
        array
            The result, in the operands' package (``out`` if given).
        """
        a_op, b_op, offs_op = bound.operands
        return self._run_pointers(bound.problem, a_op.ptr, b_op.ptr, offs_op.ptr if offs_op is not None else 0,
                                  offs_op is not None and offs_op.dtype == _dtypes.INT64, out=out, stream=stream,
                                  check_offsets=check_offsets, scales=scales, trial=trial,
                                  spans=operand_spans(bound))

    def _run_pointers(self, problem: GroupedProblem, a_pointer: int, b_pointer: int, offs_pointer: int,
                      offs_64: bool, *, out: Array | None, stream: int, check_offsets: bool | None,
                      scales: tuple[int, int] = (0, 0), trial: bool = False, capturing: bool | None = None,
                      out_pointer: int | None = None, spans: tuple[int, ...] | None = None) -> Array:
        """``run`` with the operands as pointers, for a ``problem`` this plan was made for (the same
        ``key``, its pointers' alignment checked): ``grouped_matmul``'s hot path, which reads no array.
        ``capturing``: whether ``stream`` is capturing a CUDA graph, where the caller has asked its own
        package (None: asked here). ``out_pointer``: ``out``'s pointer, where its layout is known to be the
        result's (a layout key proved it); None: ``out`` is read and checked. ``spans``: the bytes a, b and
        offs span from their pointers (``operand_spans``), for the check that ``out`` overlaps none of them
        (None: the caller's results never alias its inputs, as XLA's buffers).

        Returns
        -------
        array
            The result, in the plan's package (``out`` if given).
        """
        if self.algorithm is None:
            raise NvblasltStateError("execute: plan() first: no algorithm is selected")
        out_dtype = problem.d.dtype
        if out is None:
            allocate = self._allocators.get(problem.out_shape)
            if allocate is None:
                if len(self._allocators) >= 16:  # token counts that vary without end: keep the set small
                    self._allocators.clear()
                allocate = self._allocators[problem.out_shape] = _memory.strided_allocator(
                    self._framework, problem.out_shape, problem.out_strides, out_dtype, self.device)
            result, out_pointer = allocate(stream, stream)
            result = self._framework.hand_back(result)
        elif out_pointer is not None:
            result = out
        else:
            out_op = _read(out, "out", stream)
            if out_op.shape != problem.out_shape or out_op.strides != problem.out_strides or out_op.dtype != out_dtype:
                raise NvblasltValueError(f"out: expected a {out_dtype.name} array of shape {problem.out_shape} and "
                                         f"strides {problem.out_strides} (row-major, rows on 16 bytes), got "
                                         f"{out_op.describe()}")
            result, out_pointer = out, out_op.ptr
        if out_pointer & (problem.d.alignment - 1):
            raise NvblasltValueError(f"out: its pointer is aligned to {_grouped_problem.pointer_alignment(out_pointer)}"
                                     f" bytes; this plan needs {problem.d.alignment}")
        if out is not None and spans is not None:
            refuse_overlap(out_pointer, spans[3], (("a", a_pointer, spans[0]), ("b", b_pointer, spans[1]),
                                                   ("offs", offs_pointer, spans[2]), ("scale_a", scales[0], 4),
                                                   ("scale_b", scales[1], 4)))
        check = self._check_offsets_default if check_offsets is None else bool(check_offsets)
        with self._lock:  # the kernels' arguments and the GEMM's are the plan's own, set per call
            if scales != self._scales:  # cuBLASLt's A is the caller's b: its scale is b's
                self._launch.desc.set("A_SCALE_POINTER", scales[1])
                self._launch.desc.set("B_SCALE_POINTER", scales[0])
                self._scales = scales
            if self._several_devices:
                with _cuda.on_device(self.device):
                    self._queue(problem, (b_pointer, a_pointer, out_pointer), offs_pointer, offs_64, stream, check,
                                trial, capturing)
            else:
                self._queue(problem, (b_pointer, a_pointer, out_pointer), offs_pointer, offs_64, stream, check, trial,
                            capturing)
        return result

    def _queue(self, problem: GroupedProblem, bases: tuple[int, int, int], offs_pointer: int, offs_64: bool,
               stream: int, check: bool, trial: bool = False, capturing: bool | None = None) -> None:
        """The derive kernel, the GEMM and (weight gradients) the empty groups' zeros, on ``stream``;
        ``bases`` are cuBLASLt's A, B and D (the caller's b, a and the result)."""
        if capturing is None:
            capturing = _cuda.is_capturing(stream)
        if capturing:
            if check:
                raise NvblasltStateError("check_offsets: waits for the GPU, which a CUDA graph being captured "
                                         "on the stream forbids; check outside the capture")
            self._captured = True
            self._launch.hold_replaced_workspaces()
        if stream != self._last_stream:
            if not capturing:  # a capture may not wait on work outside it; replays run in stream order
                _memory.wait_for(self._last_stream, stream)  # arrays and workspace: one stream at a time
            self._last_stream = stream
        self._arrays.derive(offs_pointer, offs_64, problem.total, bases, (problem.a.ld, problem.b.ld, problem.d.ld),
                           stream, check=check)
        launch = self._launch
        if trial:
            launch.try_run(self._d_array, stream)
        else:
            launch.run(self._d_array, stream)  # the next planned algorithm where cuBLASLt refuses this one
        if launch.workspace is not None:
            launch.workspace.used_on(stream)
        if problem.form == "2d2d":  # a group with no K still has a result: zeros
            self._arrays.zero_empty(problem.d.dtype.itemsize, stream)

    def free(self) -> None:
        """Release the workspace and arrays, stream-ordered after the work queued so far. A CUDA graph
        that captured this plan must not be replayed after it (``grouped_matmul`` keeps such plans)."""
        self._launch.release_workspace()
        self._arrays.release()
        self._freed = True

    def __enter__(self) -> GroupedMatmul:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


def operand_spans(bound: Bound) -> tuple[int, ...]:
    """The bytes a, b and offs span from their pointers (0 for no offs), then the result's: what ``out`` must
    not overlap, and its own extent. A layout key that proves the layouts equal proves these equal too, so
    the fast paths keep them with their entry."""
    a, b, offs = (0 if op is None else extent_bytes(op) for op in bound.operands)
    problem = bound.problem
    return a, b, offs, span_elements(problem.out_shape, problem.out_strides) * problem.d.dtype.itemsize


def refuse_overlap(out_pointer: int, out_bytes: int, spans: tuple[tuple[str, int, int], ...]) -> None:
    """Refuse an ``out`` whose bytes overlap an operand's (name, pointer, bytes): the GEMM would read what it
    writes. A few integer comparisons: every call with ``out`` pays them, the fast paths included."""
    out_end = out_pointer + out_bytes
    for name, pointer, size in spans:
        if pointer and size and pointer < out_end and out_pointer < pointer + size:
            raise NvblasltValueError(f"out: overlaps {name}; write to separate memory")


# grouped_matmul()'s plans, one cache per thread (cuBLASLt handles are per thread); the torch layer's bound
# calls run the same plans (GroupedMatmul._cached): one plan per problem, and clear_grouped_plans() frees them;
# one a graph captured through a bound call sits here until its next lookup, and clearing or eviction keeps it
function_plans = PlanCaches(_MAX_PLANS, alias_limit=4 * _MAX_PLANS, held=lambda plan: plan._captured)


def cached_plan(bound: Bound, a: Array | None, b: Array | None, offs: Array | None, out_dtype: _dtypes.DType | None,
                stream: int) -> tuple[GroupedMatmul, tuple]:
    """This thread's cached plan for ``bound``'s problem and its key, made, planned and cached where there
    is none, or where a CUDA graph captured the one cached (the graph keeps that one)."""
    cache = function_plans.plans
    key = (bound.problem.key, bound.problem.d.dtype, bound.operands[0].device)
    plan = cache.get(key)
    if plan is not None and plan._captured:  # captured through another caller of the plan: eager calls get a new one
        cache.keep_captured(key)
        plan = None
    if plan is None:
        plan = GroupedMatmul(a, b, offs, out_dtype=out_dtype, stream=stream)
        plan.plan()
        plan.release_operands()  # the cache keeps no caller's array alive
        cache.add(key, plan)
    return plan, key


if TYPE_CHECKING:
    def _meets_the_declared_interface(plan: GroupedMatmul) -> GroupedPlanInternals:
        return plan  # mypy reads GroupedMatmul against what the package calls on it
