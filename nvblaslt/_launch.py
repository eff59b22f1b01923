"""``Launch``: one ``cublasLtMatmul`` call, owned whole. The handle, the matmul descriptor, the four
layouts, the preference and the workspace; the heuristics, cuBLASLt's check of an algorithm, the
selected algorithm and the fallback when the library refuses it at launch; and the prebuilt
ctypes argument tuple, which nothing else builds.

``build`` makes the descriptors of a canonical problem (``_problem``) whose epilog ``_epilogs``
has prepared; ``Launch.given`` takes descriptors a caller built (a grouped plan's layouts), with
its operands' pointer arrays in fixed argument slots. ``Matmul`` and ``GroupedMatmul`` each own
one; autotune, the search, the tuning cache and the bench drive it through these public names.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import warnings

from . import _batch_invariant, _cuda, _tuning_cache
from ._descriptors import Handle, HeuristicResult, MatmulDesc, MatmulPreference, MatrixLayout, heuristics
from ._epilogs import Prepared, configure
from ._errors import CublasLtError, NvblasltAlgorithmError, NvblasltTypeError, NvblasltValueError
from ._known_bad import refuses
from ._logging import logger
from ._memory import DeviceBuffer
from ._options import memory_limit_bytes
from ._problem import COL, unsupported_hint


def raw_function(function):
    """The same C function with no argtypes and no status check: the caller passes ctypes objects
    only (a Python int would go as a 32-bit C int) and checks the status itself."""
    return ctypes.CFUNCTYPE(function.restype)(ctypes.cast(function, ctypes.c_void_p).value)


class ForeignHandle:
    """A cublasLtHandle_t the caller owns (``options.handle``): used, never destroyed."""

    def __init__(self, handle: int, lib):
        self.handle, self.lib = int(handle), lib

    def close(self) -> None:
        pass


def build(lib, problem, prepared: Prepared, *, options, preferences, scale_pointers: dict, aux_scale_pointer,
          alignments: dict, device: int) -> tuple[MatmulDesc, list[MatrixLayout], MatmulPreference, int]:
    """(matmul descriptor, A/B/C/D layouts, preference, workspace limit) for ``problem``."""
    api = lib.api
    types = problem.types
    desc = MatmulDesc(getattr(api, f"CUBLAS_{types.compute}"), getattr(api, types.scale), lib=lib)
    desc.set("TRANSA", problem.a.op)
    desc.set("TRANSB", problem.b.op)
    desc.set("EPILOGUE", int(problem.epilog))
    if options.sm_count_target:
        desc.set("SM_COUNT_TARGET", options.sm_count_target)
    if options.fast_accumulation and problem.fp8:
        desc.set("FAST_ACCUM", 1)
    elif options.fast_accumulation:
        # nvmath-python sets FAST_ACCUM for any operands and cuBLASLt ignores it but for fp8: accepted, said
        warnings.warn(f"options.fast_accumulation: has an effect on fp8 operands only; ignored for "
                      f"{types.a.name} × {types.b.name}", UserWarning, stacklevel=5)  # the caller of Matmul.plan
    for attribute, pointer in scale_pointers.items():
        desc.set(attribute, pointer)
    if aux_scale_pointer is not None:
        desc.set("EPILOGUE_AUX_SCALE_POINTER", aux_scale_pointer)
    configure(desc, api, problem, prepared, result_amax=bool(options.result_amax))

    def layout(matrix) -> MatrixLayout:
        return MatrixLayout(getattr(api, matrix.dtype.cuda), matrix.rows, matrix.cols, matrix.ld,
                            order=matrix.order if matrix.order != COL else None,
                            batch_count=problem.batch_count, batch_stride=matrix.batch_stride, lib=lib)
    c = problem.c or dataclasses.replace(problem.d, dtype=types.c)  # no C: cuBLASLt still takes its layout
    layouts = [layout(problem.a.layout), layout(problem.b.layout), layout(c), layout(problem.d)]

    workspace_limit = workspace_cap(options.memory_limit, preferences.workspace_limit, device)
    preference = MatmulPreference(max_workspace_bytes=workspace_limit, lib=lib)
    for key, value in alignments.items():
        preference.set(f"MIN_ALIGNMENT_{key}_BYTES", value)
    if preferences.max_waves_count:
        preference.set("MAX_WAVES_COUNT", preferences.max_waves_count)
    reduction = preferences.reduction_scheme_mask
    if reduction is None and types.d.itemsize <= 2:
        # Split-K partial sums kept in a 16- or 8-bit result type lose digits (measured on an H200: 31× the
        # error of one rounding in bf16); cuBLASLt's heuristics still pick them first for some shapes.
        reduction = int(api.CUBLASLT_REDUCTION_SCHEME_INPLACE) | int(api.CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)
    if reduction is not None:
        preference.set("REDUCTION_SCHEME_MASK", reduction)
    if preferences.numerical_impl_mask is not None:
        preference.set("IMPL_MASK", preferences.numerical_impl_mask)
    return desc, layouts, preference, workspace_limit


def workspace_cap(memory_limit, workspace_limit: int, device: int) -> int:
    """``workspace_limit`` lowered to ``options.memory_limit`` of the device's memory. The default "80%"
    leaves far more than a workspace of up to 1 GiB, so only then the device's memory is not read."""
    if memory_limit == "80%" and workspace_limit <= 1 << 30:
        return workspace_limit
    return min(workspace_limit, memory_limit_bytes(memory_limit, _total_memory(device)))


@functools.lru_cache(maxsize=None)
def _total_memory(device: int) -> int:
    return int(_cuda.device_properties(device).totalGlobalMem)


class FixedScalar:
    """A scale factor fixed for a launch's life (a grouped plan's alpha 1 and beta 0), as a ``Scalar``
    hands it to cuBLASLt: ``reference``."""

    def __init__(self, value: float):
        self.value = ctypes.c_float(value)
        self.reference = ctypes.byref(self.value)


class Launch:
    """One cublasLtMatmul call: its descriptors, algorithm, workspace and prebuilt arguments.

    ``a_pointer``, ``b_pointer``, ``c_pointer`` (None without C), ``d_argument`` and
    ``stream_argument`` are mutable ``c_void_p`` objects made once and shared by every argument
    tuple: a launch takes whatever they hold. ``alpha`` and ``beta`` are the plan's ``Scalar``s (or
    ``FixedScalar``s). ``problem`` is the canonical problem, or None for a ``given`` launch."""

    def __init__(self, lib, problem, handle, desc: MatmulDesc, layouts: list,
                 preference: MatmulPreference, *, workspace_limit: int, device: int, alpha, beta):
        self.lib, self.problem, self.handle, self.desc, self.layouts = lib, problem, handle, desc, layouts
        self.preference, self.workspace_limit, self.device = preference, workspace_limit, device
        self.alpha, self.beta = alpha, beta
        self.algorithms: list[HeuristicResult] = []  # the candidates, best first
        self.algorithm: HeuristicResult | None = None
        self.workspace: DeviceBuffer | None = None
        self.workspace_size = 0  # bytes the selected algorithm is given (0: none)
        self.matmul = raw_function(lib.cublasLtMatmul)
        self.a_pointer, self.b_pointer = ctypes.c_void_p(), ctypes.c_void_p()
        self.c_pointer: ctypes.c_void_p | None = None
        self.d_argument, self.stream_argument = ctypes.c_void_p(), ctypes.c_void_p()  # set per call
        self.arguments: tuple = ()
        self.known_bad = 0  # algorithms the heuristics offered that ``_known_bad`` refuses
        self.description = ""  # a given launch's problem, for the log (a canonical one describes itself)
        self._held_workspaces: list[DeviceBuffer] | None = None  # replaced ones a CUDA graph may still use

    @classmethod
    def given(cls, lib, handle, desc: MatmulDesc, layouts: list, preference: MatmulPreference, *,
              workspace_limit: int, device: int, pointers: tuple[int, int, int], description: str) -> Launch:
        """A launch over descriptors the caller built (a grouped plan's layouts), alpha 1 and beta 0.
        ``pointers`` are the device addresses of cuBLASLt's A, B and C/D arguments, fixed for the
        launch's life (arrays of per-group pointers that a kernel rewrites per call): they fill the A,
        B and C slots once, and ``run`` is given the same D. No canonical problem: no algorithm is
        screened by ``_known_bad``, and ``description`` names the problem in the log."""
        launch = cls(lib, None, handle, desc, layouts, preference, workspace_limit=workspace_limit, device=device,
                     alpha=FixedScalar(1.0), beta=FixedScalar(0.0))
        launch.description = description
        launch.bind(*pointers)
        return launch
    @classmethod
    def planned(cls, lib, problem, prepared: Prepared, *, options, preferences, scales, operands: dict,
                aux_scale: bool, device: int, alpha, beta, algorithms, stream: int) -> tuple[Launch, list, dict]:
        """(a launch for ``problem``, its algorithms best first, the tuning cache's entry or {}): the
        caller's ``algorithms`` (checked), or the heuristics' after what an earlier search remembered;
        the workspace they need made on ``stream``. Raises NOT_SUPPORTED, with what is known of why,
        where there is no algorithm."""
        invariant = options.batch_invariant  # False, or the caller's extent that may vary ("rows"/"columns")
        if invariant and algorithms is not None:
            raise NvblasltValueError("algorithms: a plan with options.batch_invariant runs its pinned algorithm; "
                                     "give no algorithms")
        structs = algorithm_structs(algorithms, lib.api) if algorithms is not None else None
        c = operands["c"]
        alignments = {"A": operands[problem.a.source].alignment, "B": operands[problem.b.source].alignment,
                      "C": c.alignment if c is not None else 256, "D": c.alignment if problem.inplace else 256}
        desc, layouts, preference, workspace_limit = build(
            lib, problem, prepared, options=options, preferences=preferences,
            scale_pointers=scales.descriptor_pointers(problem),
            aux_scale_pointer=scales.pointer("aux") if aux_scale else None, alignments=alignments, device=device)
        handle = Handle.for_device(device) if options.handle is None else ForeignHandle(options.handle, lib)
        launch = cls(lib, problem, handle, desc, layouts, preference, workspace_limit=workspace_limit, device=device,
                     alpha=alpha, beta=beta)
        try:
            if invariant:
                found = [_batch_invariant.pinned(launch, invariant)]  # no fallback list: another kernel, other bits
            else:
                found = launch.checked(structs) if structs is not None else launch.heuristics(preferences.limit)
            if not found:
                status = int(lib.api.CUBLAS_STATUS_NOT_SUPPORTED)
                raise CublasLtError("cublasLtMatmulAlgoGetHeuristic", status, lib.status_name(status),
                                    lib.status_string(status),
                                    unsupported_hint(problem, prepared.epilog, launch.known_bad > 0))
            remembered: dict = {}
            if structs is None and not invariant:
                tuned, remembered = _tuning_cache.recall(launch)  # what an earlier autotune(search=True) found
                if tuned is not None:
                    found.insert(0, tuned)
            launch.algorithms = found
            launch.ensure_workspace(max(r.workspace_size for r in found), stream)
        except BaseException:
            launch.close()
            raise
        return launch, found, remembered

    # ---- algorithms -----------------------------------------------------------------------------------
    def heuristics(self, count: int) -> list[HeuristicResult]:
        """The heuristics' algorithms, best first, without those measured wrong here (``_known_bad``);
        [] where cuBLASLt has none."""
        try:
            a, b, c, d = self.layouts
            offered = heuristics(self.handle, self.desc, a, b, c, d, self.preference, count=count)
        except CublasLtError as error:
            if error.status_name != "CUBLAS_STATUS_NOT_SUPPORTED":
                raise
            return []
        found = [r for r in offered if not self._known_wrong(r)]
        self.known_bad = len(offered) - len(found)
        return found

    def _known_wrong(self, result: HeuristicResult) -> bool:
        return self.problem is not None and refuses(result, self.problem)

    def check(self, algo) -> HeuristicResult | None:
        """``algo`` as cuBLASLt accepts it for this launch (workspace, waves), or None if it does not
        or it is one measured wrong here."""
        lib = self.lib
        result = lib.api.cublasLtMatmulHeuristicResult_t()
        layouts = self.layouts
        try:
            lib.cublasLtMatmulAlgoCheck(self.handle.handle, self.desc.handle, layouts[0].handle, layouts[1].handle,
                                        layouts[2].handle, layouts[3].handle, ctypes.byref(algo), ctypes.byref(result))
        except CublasLtError:
            return None
        result.algo = algo  # the caller's algorithm itself, whatever the check leaves in the result's copy
        checked = HeuristicResult(result, lib)
        return None if self._known_wrong(checked) else checked

    def checked(self, structs) -> list[HeuristicResult]:
        """The caller's algorithms (``cublasLtMatmulAlgo_t`` values), each checked for this launch."""
        found = []
        for index, algo in enumerate(structs):
            result = self.check(algo)
            if result is None:
                raise NvblasltValueError(f"algorithms[{index}]: cuBLASLt's algorithm check refuses it for this plan")
            found.append(result)
        return found

    def planned_algorithm(self, algorithm) -> HeuristicResult:
        """``algorithm`` (ours, nvmath-python's, or its bytes) as one of this launch's algorithms: only
        those were checked for it and had their workspace made."""
        for result in self.algorithms:
            if result is algorithm:
                return result
        wanted = bytes(memoryview(algorithm_structs([algorithm], self.lib.api)[0]))
        for result in self.algorithms:
            if result.as_bytes() == wanted:
                return result
        raise NvblasltValueError("execute: algorithm: Algorithm passed to execute() has to be included in the "
                                 "plan() algorithms (plan(algorithms=[…]) takes it)")

    def offer(self, algorithms: list[HeuristicResult]) -> None:
        """Plan with ``algorithms``, best first (a grouped plan asking the heuristics again)."""
        self.algorithms = list(algorithms)

    def leave_out(self, refused: list[HeuristicResult]) -> None:
        """Drop the algorithms cuBLASLt refused at launch (as tuning found them), unless none would be left."""
        self.algorithms = [r for r in self.algorithms if all(r is not x for x in refused)] or self.algorithms

    def keep(self, ordered: list[HeuristicResult], prune: int | None) -> None:
        """The algorithms in ``ordered``'s order (those it lacks after them), the first ``prune`` only."""
        rest = [r for r in self.algorithms if all(r is not o for o in ordered)]
        found = [*ordered, *rest]
        self.algorithms = found[:prune] if prune else found

    def select(self, result: HeuristicResult) -> None:
        """Use ``result`` from the next launch on (its workspace must be ensured first)."""
        self.algorithm = result
        workspace = self.workspace
        self.workspace_size = workspace.size if workspace is not None and result.workspace_size else 0
        self._build_arguments()

    def ensure_workspace(self, nbytes: int, stream: int) -> None:
        """A workspace of at least ``nbytes``. The old one is freed after work queued on it, and only
        once the new one exists: a failed allocation leaves the launch whole, on the old one."""
        if nbytes <= (self.workspace.size if self.workspace is not None else 0):
            return
        old, self.workspace = self.workspace, DeviceBuffer(nbytes, stream)
        if self.algorithm is not None:
            self.select(self.algorithm)  # the arguments must not keep the old one's pointer
        if old is not None and self._held_workspaces is not None:
            self._held_workspaces.append(old)  # a CUDA graph replays with it: kept for the launch's life
        elif old is not None:
            old.release()

    def hold_replaced_workspaces(self) -> None:
        """From now on a workspace that a larger one replaces is kept, not released: a CUDA graph
        captured this launch and replays with the pointer it had."""
        if self._held_workspaces is None:
            self._held_workspaces = []

    def release_workspace(self) -> None:
        if self.workspace is not None:
            self.workspace.release()
            self.workspace = None

    # ---- pointers and arguments -------------------------------------------------------------------------
    def pointer_setter(self, attribute: str):
        """set(pointer) for one pointer attribute of the matmul descriptor, its ctypes call prebuilt."""
        lib = self.lib
        member = lib.api.cublasLtMatmulDescAttributes_t[attribute]
        setter, handle, value = lib.cublasLtMatmulDescSetAttribute, ctypes.c_void_p(self.desc.handle), ctypes.c_void_p()
        reference, size = ctypes.byref(value), ctypes.sizeof(value)

        def set_pointer(pointer: int) -> None:
            value.value = pointer
            setter(handle, member, reference, size)
        return set_pointer

    def caller_pointer(self, name: str) -> int:
        """Where the next launch reads the caller's ``name`` (``"a"`` or ``"b"``; cuBLASLt's A is the
        caller's B when the problem is transposed)."""
        slot = self.a_pointer if (name == "a") == (self.problem.a.source == "a") else self.b_pointer
        return int(slot.value or 0)

    def point_caller(self, name: str, pointer: int) -> None:
        """Read the caller's ``name`` (``"a"`` or ``"b"``) at ``pointer`` from the next launch on."""
        if (name == "a") == (self.problem.a.source == "a"):
            self.a_pointer.value = pointer
        else:
            self.b_pointer.value = pointer

    def bind(self, a: int, b: int, c: int | None) -> None:
        """cuBLASLt's A, B and C pointers (the caller's B and A when the problem is transposed)."""
        self.a_pointer.value, self.b_pointer.value = a, b
        if c is None:
            return
        if self.c_pointer is None:
            self.c_pointer = ctypes.c_void_p(c)
            self._build_arguments()
        else:
            self.c_pointer.value = c

    def _build_arguments(self) -> None:
        # No argtypes: every argument is a ctypes object already, so ctypes converts nothing per call
        # (measured on the H200 host: 0.8 to 1.6 µs a call less than with argtypes). The arguments fixed
        # for the plan go as from_param() objects, which ctypes passes as they are; a c_void_p instance
        # is turned into one on every call (0.9 µs a call less over 16 arguments, H200 host).
        if self.algorithm is None:
            return
        fixed = ctypes.c_void_p.from_param
        layouts = self.layouts
        # Without C, cuBLASLt still takes a C pointer; D's own is fine unless C's type differs (fp8 results),
        # where cuBLASLt would take C == D for an in-place call with mismatched descriptors.
        if self.c_pointer is not None:
            c_argument = self.c_pointer
        else:
            types = self.problem.types
            c_argument = self.d_argument if types.c == types.d else self.a_pointer
        workspace = self.workspace.pointer if self.workspace is not None and self.workspace_size else None
        self.arguments = (fixed(self.handle.handle), fixed(self.desc.handle), self.alpha.reference, self.a_pointer,
                          fixed(layouts[0].handle), self.b_pointer, fixed(layouts[1].handle), self.beta.reference,
                          c_argument, fixed(layouts[2].handle), self.d_argument, fixed(layouts[3].handle),
                          ctypes.byref(self.algorithm.algorithm.algo), fixed(workspace),
                          ctypes.c_size_t.from_param(self.workspace_size), self.stream_argument)

    # ---- running ----------------------------------------------------------------------------------------
    def run(self, d_pointer: int, stream: int) -> None:
        """One cublasLtMatmul into ``d_pointer`` on ``stream``. Where cuBLASLt refuses the selected
        algorithm at launch (NOT_SUPPORTED, seen for aux epilogs with M=1 on an algorithm the
        heuristics offered), the next one of the list is tried; any other status raises."""
        self.d_argument.value = d_pointer
        self.stream_argument.value = stream
        status = self.matmul(*self.arguments)
        if status:
            self.recover(status)

    def try_run(self, d_pointer: int, stream: int) -> None:
        """One cublasLtMatmul with the selected algorithm, raising on any refusal (no fallback: the
        caller is choosing among algorithms)."""
        self.d_argument.value = d_pointer
        self.stream_argument.value = stream
        status = self.matmul(*self.arguments)
        if status:
            raise self.error(status)

    def error(self, status: int) -> CublasLtError:
        lib = self.lib
        return CublasLtError("cublasLtMatmul", status, lib.status_name(status), lib.status_string(status))

    def recover(self, status: int) -> None:
        """After a launch with the current arguments returned ``status``: where cuBLASLt refused the
        selected algorithm (NOT_SUPPORTED), the next one of the list is tried on the same arguments
        (see ``run``); any other status, or none left, raises. For a caller that made ``run``'s call
        itself (a bound GEMM, one frame less)."""
        while self.lib.status_name(status) == "CUBLAS_STATUS_NOT_SUPPORTED" and self._next_algorithm():
            logger.info("cublasLtMatmul refused an algorithm for %s; trying %s",
                        self.problem.describe() if self.problem is not None else self.description, self.algorithm)
            status = self.matmul(*self.arguments)  # the same pointer objects: this call's operands
            if not status:
                return
        raise self.error(status)

    def _next_algorithm(self) -> bool:
        """Drop the algorithm cuBLASLt refused at launch; False if it was not from the list or none is left.
        One that needs more workspace than the launch holds is passed over: nothing is allocated here,
        where a CUDA graph may be capturing the call."""
        if not any(r is self.algorithm for r in self.algorithms):
            return False
        while self.algorithms and self.algorithms[0] is not self.algorithm:
            self.algorithms.pop(0)
        held = self.workspace.size if self.workspace is not None else 0
        while len(self.algorithms) > 1:
            self.algorithms.pop(0)
            if self.algorithms[0].workspace_size <= held:
                self.select(self.algorithms[0])
                return True
        return False

    def close(self) -> None:
        """Destroy the descriptors and release the workspace (stream-ordered after queued work)."""
        for owned in (self.desc, self.preference, *self.layouts):
            owned.close()
        self.release_workspace()


def algorithm_ids(lib, types, options, device: int, limit: int) -> list[int]:
    """``cublasLtMatmulAlgoGetIds``: the ids of the algorithms cuBLASLt has for ``types``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise NvblasltValueError(f"limit: expected a positive int, got {limit!r}")
    api = lib.api
    handle = Handle.for_device(device) if options.handle is None else ForeignHandle(options.handle, lib)
    ids, returned = (ctypes.c_int * limit)(), ctypes.c_int()
    lib.cublasLtMatmulAlgoGetIds(handle.handle, getattr(api, f"CUBLAS_{types.compute}"), getattr(api, types.scale),
                                 *(getattr(api, t.cuda) for t in (types.a, types.b, types.c, types.d)), limit, ids,
                                 ctypes.byref(returned))
    return list(ids[:returned.value])


__all__ = ["FixedScalar", "ForeignHandle", "Launch", "algorithm_ids", "algorithm_structs", "build", "raw_function"]


def algorithm_structs(algorithms, api) -> list:
    """``cublasLtMatmulAlgo_t`` values from the caller's algorithms (ours, nvmath-python's, or their bytes)."""
    if not isinstance(algorithms, (list, tuple)) or not algorithms:
        raise NvblasltTypeError(f"algorithms: expected a non-empty list of algorithms, got {algorithms!r}")
    struct_type = api.cublasLtMatmulAlgo_t
    structs = []
    for index, item in enumerate(algorithms):
        algo = getattr(item, "algorithm", item)
        algo = getattr(algo, "algo", algo)
        if not isinstance(algo, struct_type):
            raw = getattr(item, "algorithm", item)
            try:  # nvmath-python's Algorithm keeps the algorithm's bytes (a NumPy array)
                algo = struct_type.from_buffer_copy(bytes(memoryview(raw)))
            except (TypeError, ValueError, BufferError):
                raise NvblasltAlgorithmError(f"algorithms[{index}]: expected an algorithm from plan()/autotune(), got "
                                        f"{type(item).__name__}") from None
        structs.append(algo)
    return structs
