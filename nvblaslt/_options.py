"""The options objects of nvmath-python's matmul API, with its field names: ``MatmulOptions``,
``MatmulPlanPreferences``, ``MatmulEpilogPreferences``, ``MatmulQuantizationScales`` and
the ``qualifiers`` dtype. Each accepts a dict with the same keys, as nvmath-python does."""

from __future__ import annotations

import dataclasses
import operator
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._address import readable
from ._errors import CublasLtError, NvblasltArgumentError, NvblasltTypeError, NvblasltValueError
from ._types import check_compute_type

if TYPE_CHECKING:  # imported by __post_init__ only when a logger is given (then its caller has imported it)
    import logging

DEFAULT_WORKSPACE = 32 << 20  # what cuBLASLt's docs suggest for Hopper
HANDLE_ALIGNMENT = 8  # a cublasLtHandle_t points to a heap object holding pointers
_SIZE = re.compile(r"^\s*(?P<number>(\d+\.?\d*|\.\d+)(e[+-]?\d+)?)\s*(?P<unit>(?P<power>[kmgt]?)(?P<binary>i?)b|%)\s*$",
                   re.IGNORECASE)


def _valid_size(text: str) -> bool:
    """A size with a unit ("8 GiB", "512 kB", "5e7 B") or a share from 0 to 100 % (as nvmath-python takes)."""
    match = _SIZE.match(text)
    return match is not None and (match["unit"] != "%" or 0 < float(match["number"]) <= 100)


def memory_limit_bytes(limit: int | float | str, total: int) -> int:
    """``options.memory_limit`` in bytes on a GPU of ``total`` bytes, read as nvmath-python reads
    it: an int is bytes, a float up to 1 a share of the GPU's memory, "80%" a share, "8 GB"
    decimal and "8 GiB" binary units."""
    if isinstance(limit, int):
        return limit
    if isinstance(limit, float):
        return int(limit * total) if limit <= 1 else int(limit)
    match = _SIZE.match(limit)
    assert match is not None  # MatmulOptions checked the form
    number = float(match["number"])
    if match["unit"] == "%":
        return int(number * total / 100)
    power = match["power"].lower()
    exponent = "kmgt".index(power) + 1 if power else 0
    return int(number * (1024 if match["binary"] else 1000) ** exponent)


@dataclass
class MatmulOptions:
    """How the multiplication is set up (nvmath-python's ``MatmulOptions``, with its field names).

    The ``options`` argument of ``matmul`` and ``Matmul`` takes one of these, a dict with the
    same keys, or nvmath-python's own ``MatmulOptions``. Every field is checked where the object
    is made (a dict: where it is given), before any GPU work.

    Parameters
    ----------
    compute_type : str or int, optional
        cuBLAS's compute type: a name (``"COMPUTE_32F_FAST_TF32"``, ``"CUBLAS_COMPUTE_32F"``), a
        short name (``"tf32"``), a ``cublasComputeType_t`` value, or nvmath-python's enum member.
        None: the usual one for the operand types. ``compute_type=`` of ``matmul`` and ``Matmul``
        is a shortcut for it.
    scale_type : str, dtype or int, optional
        The type of alpha and beta: a dtype or ``cudaDataType`` name (``"float32"``,
        ``"CUDA_R_32F"``) or value. None: the one that goes with the compute type.
    result_type : str, dtype or int, optional
        D's dtype: a name (``"bfloat16"``, ``"float8_e4m3fn"``), a NumPy / CuPy / PyTorch dtype,
        or a ``cudaDataType`` value. None: ``c``'s dtype, else ``a``'s.
    result_amax : bool, default False
        Also return ``amax(|D|)``, the largest absolute value of the result, as
        ``aux["result_amax"]``, a float32 array of shape (1,); fp8 results only.
    inplace : bool, default False
        Write D into ``c``, which must be given and hold the whole result (every batch, no
        broadcast column); D's dtype is then ``c``'s, and the result returned is ``c`` itself.
    block_scaling : bool, default False
        Block-scaled (MXFP8 / NVFP4) multiplication: not supported yet, only False is accepted.
    sm_count_target : int, default 0
        How many SMs the kernels may assume they have (cuBLASLt's ``SM_COUNT_TARGET``), to leave
        the others to concurrent work; 0 (or None): all of them.
    fast_accumulation : bool, default False
        cuBLASLt's fast fp8 accumulation (``FAST_ACCUM``: fewer promotions to fp32). It acts on
        fp8 operands only; for others it is accepted, as nvmath-python accepts it, with a warning
        at ``plan()``.
    device_id : int, default 0
        The GPU that host (NumPy, CPU torch) operands are staged to and multiplied on; GPU
        operands run on their own device. None is 0; a negative id is refused where the options
        are used.
    handle : int, optional
        A ``cublasLtHandle_t`` of the caller's, as an int, for the operands' device; the caller
        keeps ownership (nvblaslt never destroys it). None: nvblaslt's handle for this thread and
        device. 0, a negative or wider than 64-bit int, an address not aligned to 8 bytes or one
        this process cannot read is refused where the options are made, and a ``Handle`` of
        nvblaslt's made for another GPU where the plan is; a readable address that holds no
        handle cannot be told from a handle, and cuBLASLt may crash on it.
    logger : logging.Logger, optional
        Where nvblaslt logs its decisions (plans, tuning); default the ``nvblaslt`` logger.
    memory_limit : int, float or str, default "80%"
        The most workspace an algorithm may use: bytes (an int, or a float above 1), a share of
        the GPU's memory (a float up to 1.0, or ``"10%"``), or a size with a unit (``"512 MB"``,
        ``"1 GiB"``). It lowers ``preferences.workspace_limit``, never raises it. None is the
        default.
    blocking : True or "auto", default "auto"
        True: each call waits for its result on the GPU. ``"auto"``: only calls with host
        operands wait (their results are copied back); GPU calls return at once.
    allocator : object, optional
        Accepted as nvmath-python's memory manager (an object with ``memalloc_async`` or
        ``memalloc``) but not used: nvblaslt allocates results from the operands' own package.
    batch_invariant : bool or {"rows", "columns"}, default False
        nvblaslt's addition: row i of the result is bitwise the same whatever the number of rows,
        on the same GPU and cuBLASLt. One algorithm, without split-K, is pinned for every M, chosen
        per the rest of the problem (N, K, types, layouts, epilog) and recorded in a loaded tuning
        database if it has one; ``plan()`` refuses a problem where cuBLASLt does not accept it.
        True (or ``"rows"``) varies the rows of ``a`` and of the result; ``"columns"`` the columns
        of ``b`` and of the result (``W @ xᵀ`` with a bias per feature). ``autotune()`` then times
        the pinned algorithm only. Stored as False, ``"rows"`` or ``"columns"``.

    Raises
    ------
    NvblasltValueError
        ``compute_type`` is not a compute type of any cuBLAS release nvblaslt knows; ``blocking``
        is neither True nor ``"auto"``; ``block_scaling`` is True; ``sm_count_target`` is not an
        int ≥ 0; ``memory_limit`` is not a size nvblaslt can read; ``handle`` is 0, negative,
        beyond 64 bits, misaligned or not readable in this process.
    NvblasltTypeError
        ``device_id`` is not an int; ``result_amax``, ``inplace``, ``block_scaling`` or
        ``fast_accumulation`` is not a bool; ``handle`` is not an int; ``logger`` is not a
        ``logging.Logger``; ``allocator`` has neither ``memalloc_async`` nor ``memalloc``;
        ``batch_invariant`` is none of False, True, ``"rows"``, ``"columns"``.

    See Also
    --------
    MatmulPlanPreferences : what the heuristics may return.

    Notes
    -----
    ``compute_type`` is checked against every compute type nvblaslt knows when the options are
    made, and against the loaded cuBLASLt when they are used. ``scale_type`` and ``result_type``
    are checked where the operands' types are known (``Matmul(…)``, ``matmul(…)``). Calls with a
    ``handle`` or a ``logger`` are not cached by ``matmul()``.

    Examples
    --------
    >>> from nvblaslt import MatmulOptions
    >>> options = MatmulOptions(compute_type="tf32", memory_limit="1 GiB", blocking=True)
    >>> options.compute_type, options.memory_limit, options.blocking
    ('tf32', '1 GiB', True)
    >>> MatmulOptions(device_id=None, sm_count_target=None).device_id
    0
    >>> MatmulOptions(blocking=False)
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: options.blocking: The value specified for blocking must be either True or 'auto'. ...
    >>> MatmulOptions(inplace="yes")
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltTypeError: options.inplace: expected a bool, got 'yes'
    """

    compute_type: Any = None
    scale_type: Any = None
    result_type: Any = None
    result_amax: bool = False
    inplace: bool = False
    block_scaling: bool = False
    sm_count_target: int | None = 0
    fast_accumulation: bool | None = False
    device_id: int | None = 0
    handle: int | None = None
    logger: logging.Logger | None = None
    memory_limit: int | str | None = "80%"
    blocking: Any = "auto"
    allocator: Any = None
    batch_invariant: bool | str = False

    def __post_init__(self):
        self.batch_invariant = _batch_invariant_value(self.batch_invariant)
        if self.compute_type is not None:  # as nvmath-python's ComputeType(value) does, here and not at first use
            check_compute_type(self.compute_type, "options.compute_type")
        try:  # 1 and NumPy's True pass nvmath-python's `in (True, "auto")`: taken as True
            one = not isinstance(self.blocking, str) and bool(self.blocking == True)  # noqa: E712
        except Exception:  # noqa: BLE001 - an array or an odd object: refused below
            one = False
        if one:
            self.blocking = True
        elif not (isinstance(self.blocking, str) and self.blocking == "auto"):
            raise NvblasltValueError(f"options.blocking: The value specified for blocking must be either True or "
                                     f"'auto'. Got {self.blocking!r}")
        if self.device_id is None:
            self.device_id = 0
        if isinstance(self.device_id, bool) or not isinstance(self.device_id, int):
            raise NvblasltTypeError(f"options.device_id: expected a GPU ordinal (int ≥ 0), got {self.device_id!r}")
        # a negative ordinal is refused where the options are used, as nvmath-python does: see check_device_id
        for name in ("result_amax", "inplace", "block_scaling"):
            if not isinstance(getattr(self, name), bool):
                raise NvblasltTypeError(f"options.{name}: expected a bool, got {getattr(self, name)!r}")
        if self.block_scaling:
            raise NvblasltValueError("options.block_scaling: block-scaled (MXFP8/NVFP4) matmuls are not supported "
                                     "by nvblaslt yet")
        if self.sm_count_target is None:
            self.sm_count_target = 0
        if isinstance(self.sm_count_target, bool) or not isinstance(self.sm_count_target, int) \
                or self.sm_count_target < 0:
            raise NvblasltValueError(f"options.sm_count_target: expected an int ≥ 0, got {self.sm_count_target!r}")
        if self.handle is not None:
            check_handle(self.handle)
        if self.memory_limit is None:
            self.memory_limit = "80%"
        limit = self.memory_limit
        if isinstance(limit, bool) or not isinstance(limit, (int, float, str)) or (
                isinstance(limit, str) and not _valid_size(limit)) or (
                not isinstance(limit, str) and not 0 <= limit < float("inf")):
            raise NvblasltValueError(f"options.memory_limit: expected bytes (a number ≥ 0, or a share of the GPU's "
                                     f"memory up to 1.0), a size such as '8 GiB', or a share such as '80%', got "
                                     f"{limit!r}")
        if not isinstance(self.fast_accumulation, (bool, type(None))):
            raise NvblasltTypeError(f"options.fast_accumulation: expected a bool, got {self.fast_accumulation!r}")
        if self.allocator is not None and not any(callable(getattr(self.allocator, method, None))
                                                  for method in ("memalloc_async", "memalloc")):
            raise NvblasltTypeError(f"options.allocator: expected a memory manager with memalloc_async(size, stream) "
                                    f"or memalloc(size) (nvmath-python's BaseCUDAMemoryManagerAsync / "
                                    f"BaseCUDAMemoryManager), got {type(self.allocator).__name__}")
        if self.logger is not None:
            import logging

            if not isinstance(self.logger, logging.Logger):
                raise NvblasltTypeError(f"options.logger: expected a logging.Logger, got {type(self.logger).__name__}")


def _batch_invariant_value(value) -> bool | str:
    """False, "rows" or "columns" from what ``options.batch_invariant`` takes."""
    if value is None or value is False:
        return False
    if value is True:
        return "rows"
    if isinstance(value, str) and value in ("rows", "columns"):
        return value
    raise NvblasltTypeError(f"options.batch_invariant: expected False, True (the rows of a and of the result), "
                            f"'rows' or 'columns', got {value!r}")


@dataclass
class MatmulEpilogPreferences:
    """Preferences for the epilog's aux output (nvmath-python's ``MatmulEpilogPreferences``).

    Given as ``MatmulPlanPreferences(epilog=…)``, or as the ``"epilog"`` key of a preferences
    dict (itself a dict or one of these). The values are checked at ``plan()``, against the epilog
    and the operand types.

    Parameters
    ----------
    aux_type : str or dtype, optional
        The dtype of the GELU aux output of ``GELU_AUX`` / ``GELU_AUX_BIAS``: an fp8 type
        (``"float8_e4m3fn"``, ``"float8_e5m2"``, or a package's dtype), which then needs
        ``epilog_inputs["aux_quantization_scale"]``, or the default type itself. None: D's type
        (``c``'s where D is fp8). Only GELU aux epilogs take one (the ReLU aux is a bitmask).
    aux_amax : bool, default False
        Also return the fp8 aux's largest absolute value as ``aux["gelu_aux_amax"]``, a float32
        array of shape (1,); only with an fp8 ``aux_type``.

    See Also
    --------
    MatmulPlanPreferences : where these go.

    Examples
    --------
    >>> from nvblaslt import MatmulEpilogPreferences, MatmulPlanPreferences
    >>> MatmulEpilogPreferences(aux_type="float8_e4m3fn", aux_amax=True)
    MatmulEpilogPreferences(aux_type='float8_e4m3fn', aux_amax=True)
    >>> MatmulPlanPreferences(epilog={"aux_type": "float8_e5m2"}).epilog.aux_type
    'float8_e5m2'

    On a GPU, a GELU aux in fp8 with its scale and amax:

    .. code-block:: python

        y, aux = nvblaslt.matmul(a, b, epilog="GELU_AUX_BIAS",
                                 epilog_inputs={"bias": bias, "aux_quantization_scale": 1.0},
                                 preferences={"epilog": {"aux_type": "float8_e4m3fn", "aux_amax": True}})
        aux["gelu_aux"], aux["gelu_aux_amax"]
    """

    aux_type: Any = None
    aux_amax: bool = False


@dataclass
class MatmulPlanPreferences:
    """What cuBLASLt's heuristics may return (nvmath-python's ``MatmulPlanPreferences``).

    The ``preferences`` argument of ``matmul`` and ``Matmul.plan`` takes one of these, a dict
    with the same keys, or nvmath-python's own ``MatmulPlanPreferences``. The values are checked
    where the object is made.

    Parameters
    ----------
    reduction_scheme_mask : int, optional
        The split-K reduction schemes allowed (a bit mask of ``cublasLtReductionScheme_t``, the
        preference's ``REDUCTION_SCHEME_MASK``). None: for results of 16 bits or fewer, nvblaslt
        passes ``INPLACE | COMPUTE_TYPE``, leaving out ``OUTPUT_TYPE`` (whose partial sums,
        kept in the narrow result type, lose digits); for others, cuBLASLt's default (any).
    max_waves_count : float, default 0.0
        The most waves an algorithm may take (``MAX_WAVES_COUNT``); 0 (or None): no limit.
    numerical_impl_mask : int, optional
        The numerical implementations allowed (a bit mask, the preference's ``IMPL_MASK``);
        None: any.
    limit : int, default 8
        How many algorithms to ask the heuristics for (up to 1024); ``autotune()`` times them.
        0 is kept, as nvmath-python keeps it: ``plan(algorithms=…)`` asks no heuristics and runs;
        otherwise ``plan()`` refuses it before any GPU work with a ``CublasLtError``
        (``CUBLAS_STATUS_INVALID_VALUE``, what cuBLASLt answers nvmath-python) that is also a
        ``ValueError``.
    epilog : MatmulEpilogPreferences or dict, optional
        Preferences for the epilog's aux output (``aux_type``, ``aux_amax``).
    workspace_limit : int, default 33554432
        The most workspace in bytes an algorithm may use (32 MiB, what cuBLASLt's documentation
        suggests for Hopper); ``options.memory_limit`` may lower it. nvblaslt's addition.

    Raises
    ------
    NvblasltValueError
        ``limit`` is not from 0 to 1024 (an ``NvblasltArgumentError``, also a ``TypeError``, where
        it is no integer); ``workspace_limit`` is not an int ≥ 0;
        ``max_waves_count`` is not a number ≥ 0; a mask is not an int ≥ 0; ``epilog`` is a dict
        with unknown keys.
    NvblasltTypeError
        ``epilog`` is neither a dict nor ``MatmulEpilogPreferences``.

    See Also
    --------
    MatmulEpilogPreferences : the ``epilog`` field.
    MatmulOptions : how the multiplication is set up.

    Examples
    --------
    >>> from nvblaslt import MatmulPlanPreferences
    >>> preferences = MatmulPlanPreferences(limit=16, workspace_limit=64 << 20)
    >>> preferences.limit, preferences.workspace_limit, preferences.epilog.aux_type
    (16, 67108864, None)
    >>> MatmulPlanPreferences(limit=2048)
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: preferences.limit: expected an int from 0 to 1024 (0 only with ...), got 2048

    On a GPU, ask for more algorithms to time:

    .. code-block:: python

        mm.plan(preferences={"limit": 32})
        mm.autotune()
    """

    reduction_scheme_mask: int | None = None
    max_waves_count: float | None = 0.0
    numerical_impl_mask: int | None = None
    limit: int = 8
    epilog: MatmulEpilogPreferences | dict | None = None
    workspace_limit: int = DEFAULT_WORKSPACE

    def __post_init__(self):
        if self.max_waves_count is None:
            self.max_waves_count = 0.0
        # 0 is kept, as nvmath-python keeps it: plan(algorithms=…) asks no heuristics and runs with it; where the
        # heuristics are asked, plan() refuses it before any GPU work (check_heuristics_limit)
        try:  # an int or a NumPy integer; anything else is a TypeError where nvmath-python sizes its buffer with it
            limit = None if isinstance(self.limit, bool) else operator.index(self.limit)
        except TypeError:
            raise NvblasltArgumentError(f"preferences.limit: expected an int from 0 to 1024 (0 only with "
                                        f"plan(algorithms=…)), got {self.limit!r}") from None
        if limit is None or not 0 <= limit <= 1024:
            raise NvblasltValueError(f"preferences.limit: expected an int from 0 to 1024 (0 only with "
                                     f"plan(algorithms=…)), got {self.limit!r}")
        self.limit = limit
        if isinstance(self.workspace_limit, bool) or not isinstance(self.workspace_limit, int) \
                or not 0 <= self.workspace_limit < 1 << 40:
            raise NvblasltValueError(f"preferences.workspace_limit: expected bytes (an int ≥ 0), got "
                                     f"{self.workspace_limit!r}")
        if isinstance(self.max_waves_count, bool) or not isinstance(self.max_waves_count, (int, float)) \
                or not 0 <= self.max_waves_count < 1e9:
            raise NvblasltValueError(f"preferences.max_waves_count: expected a number ≥ 0, got "
                                     f"{self.max_waves_count!r}")
        for name in ("reduction_scheme_mask", "numerical_impl_mask"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value < 1 << 64):
                raise NvblasltValueError(f"preferences.{name}: expected a bit mask (int ≥ 0), got {value!r}")
        self.epilog = as_options(MatmulEpilogPreferences, self.epilog, "preferences.epilog")


def check_handle(handle: object) -> None:
    """Refuse an ``options.handle`` that cannot be a ``cublasLtHandle_t`` of this process, before
    cuBLASLt dereferences it (where a bad one crashes the process): not an int, NULL, negative,
    beyond 64 bits, misaligned, or an address this process cannot read. A readable address that is
    not a handle cannot be told apart here; a handle of nvblaslt's on another GPU is refused where
    the plan's device is known (``_descriptors.check_handle_device``)."""
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise NvblasltTypeError(f"options.handle: expected a cublasLtHandle_t as an int, got {handle!r}")
    if not 0 < handle < 1 << 64:
        raise NvblasltValueError(f"options.handle: expected a cublasLtHandle_t (a non-NULL pointer, an int from 1 "
                                 f"to 2**64 - 1), got {handle!r}")
    if handle % HANDLE_ALIGNMENT:
        raise NvblasltValueError(f"options.handle: expected a cublasLtHandle_t (a pointer to cuBLASLt's context, "
                                 f"aligned to {HANDLE_ALIGNMENT} bytes), got 0x{handle:x}")
    if readable(handle, HANDLE_ALIGNMENT) is False:
        raise NvblasltValueError(f"options.handle: expected a cublasLtHandle_t, got 0x{handle:x}, an address this "
                                 f"process cannot read (no handle lives there; cuBLASLt would crash on it)")


class HeuristicsLimitError(CublasLtError, NvblasltValueError):
    """``preferences.limit=0`` where the heuristics are to be asked. nvmath-python passes it on to
    ``cublasLtMatmulAlgoGetHeuristic``, which answers ``CUBLAS_STATUS_INVALID_VALUE``; nvblaslt
    refuses it before any GPU work with an error of the same kind: a ``CublasLtError`` with that
    status, and a ``ValueError`` naming the argument."""

    def __init__(self, status: int, status_name: str, library_message: str):
        self.function, self.status, self.status_name = "cublasLtMatmulAlgoGetHeuristic", status, status_name
        self.library_message = library_message
        Exception.__init__(self, f"preferences.limit: expected an int from 1 to 1024 where the heuristics are asked "
                                 f"(0 only with plan(algorithms=…)), got 0; refused before the call, which answers "
                                 f"{status_name} for it ({library_message})")


def check_heuristics_limit(preferences: MatmulPlanPreferences, lib) -> None:
    """Refuse ``preferences.limit=0`` before any GPU work where the heuristics are to be asked (no
    ``algorithms`` given): cuBLASLt answers INVALID_VALUE, after the handle and descriptors are made."""
    if preferences.limit == 0:
        status = int(lib.api.CUBLAS_STATUS_INVALID_VALUE)
        raise HeuristicsLimitError(status, lib.status_name(status), lib.status_string(status))


@dataclass
class MatmulQuantizationScales:
    """The scales of fp8 operands and results (nvmath-python's ``MatmulQuantizationScales``).

    The ``quantization_scales`` argument of ``matmul``, ``Matmul`` and
    ``Matmul.reset_operands`` takes one of these, a dict with keys among ``"a"``, ``"b"``,
    ``"c"``, ``"d"``, or nvmath-python's own ``MatmulQuantizationScales``. cuBLASLt computes
    ``D = scale_d * (alpha * (scale_a * A) @ (scale_b * B) + beta * (scale_c * C))``. Every fp8
    operand and an fp8 result must have a scale, and only those may have one; the values are
    checked where they are used, not here.

    Parameters
    ----------
    a, b, c, d : number or array, optional
        Each a Python number or NumPy scalar (a finite float32 value, copied to the GPU), or a
        float32 GPU array of shape () or (1,) on the plan's device, read by the GPU at each
        execution (so its value may change between executions without a reset). With host
        operands, a one-element float32 host array is read once, as a number. None: no scale.

    See Also
    --------
    MatmulOptions : ``result_amax`` for fp8 results.

    Examples
    --------
    >>> from nvblaslt import MatmulQuantizationScales
    >>> MatmulQuantizationScales(a=0.5, b=2.0, d=1.0)
    MatmulQuantizationScales(a=0.5, b=2.0, c=None, d=1.0)

    On a GPU, with PyTorch fp8 operands (``a`` row-major, ``b`` column-major):

    .. code-block:: python

        a8 = torch.randn(64, 128, device="cuda").to(torch.float8_e4m3fn)
        b8 = torch.randn(32, 128, device="cuda").to(torch.float8_e4m3fn).T
        d = nvblaslt.matmul(a8, b8, quantization_scales={"a": 0.5, "b": 2.0},
                            options={"result_type": "bfloat16"})
    """

    a: Any = None
    b: Any = None
    c: Any = None
    d: Any = None


def _qualifiers_dtype():
    import numpy as np

    return np.dtype([("structure", object), ("is_conjugate", "<i4")])


class _LazyQualifiersDtype:
    """``matrix_qualifiers_dtype`` without importing NumPy at ``import nvblaslt``."""

    _dtype = None

    def get(self):
        if self._dtype is None:
            self._dtype = _qualifiers_dtype()
        return self._dtype


qualifiers_dtype = _LazyQualifiersDtype()


def as_options(cls, value, argument: str):
    """``cls`` from None, an instance, or a dict of its fields (nvmath-python accepts either)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return dataclasses.replace(value)
    if type(value).__name__ == cls.__name__ and dataclasses.is_dataclass(value) and not isinstance(value, type):
        # nvmath-python's own class of the same name
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in dataclasses.asdict(value).items() if k in known})
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise NvblasltValueError(f"{argument}: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**value)
    raise NvblasltTypeError(f"{argument}: expected a dict or {cls.__name__}, got {type(value).__name__}")


def with_shortcuts(options, compute_type=None, result_type=None) -> MatmulOptions:
    """``options`` (None, a dict or a ``MatmulOptions``) as a new ``MatmulOptions`` with the
    ``compute_type=`` / ``result_type=`` keywords of ``matmul`` and ``Matmul`` applied. A keyword
    also set in ``options`` is refused: which of the two should win would be a guess."""
    found = as_options(MatmulOptions, options, "options")
    changes = {}
    for name, value in (("compute_type", compute_type), ("result_type", result_type)):
        if value is None:
            continue
        if getattr(found, name) is not None:
            raise NvblasltValueError(f"{name}: given both as a keyword ({value!r}) and in options.{name} "
                                     f"({getattr(found, name)!r}); give it once")
        if name == "compute_type":
            check_compute_type(value, name)
        changes[name] = value
    return dataclasses.replace(found, **changes) if changes else found


def conjugate_flags(qualifiers) -> tuple[bool, bool]:
    """(conjugate A, conjugate B) from nvmath-python's qualifiers: a length-3 array of
    ``matrix_qualifiers_dtype`` (or a sequence of dicts with ``is_conjugate``)."""
    if qualifiers is None:
        return False, False
    if getattr(qualifiers, "ndim", 1) != 1:
        raise NvblasltValueError(f"qualifiers: expected a 1-D array of 3 matrix qualifiers, got "
                                 f"{getattr(qualifiers, 'ndim')} dimensions")
    try:
        entries = [qualifiers[i] for i in range(len(qualifiers))]
    except (TypeError, KeyError, IndexError):  # a mapping or a sequence not indexed 0, 1, 2
        raise NvblasltTypeError(f"qualifiers: expected an array of 3 matrix qualifiers (A, B, C), got "
                                f"{type(qualifiers).__name__}") from None
    if len(entries) != 3:
        raise NvblasltValueError(f"qualifiers: expected 3 entries (A, B, C), got {len(entries)}")
    flags = []
    for name, entry in zip("abc", entries):
        try:
            flag = entry["is_conjugate"]
        except (KeyError, IndexError, TypeError, ValueError):
            raise NvblasltTypeError(f"qualifiers[{name!r}]: expected a record with 'is_conjugate', got "
                                    f"{entry!r}") from None
        try:
            value = operator.index(flag)  # bools, ints, NumPy integers (the dtype's field is an int32)
        except TypeError:
            value = None
        if value not in (0, 1):
            raise NvblasltValueError(f"qualifiers[{name!r}]['is_conjugate']: expected the integer 0 or 1 (or a bool), got "
                                     f"{flag!r}")
        flags.append(bool(value))
    if flags[2]:
        raise NvblasltValueError("qualifiers: conjugating C is not supported (cuBLASLt has no conjugate C)")
    return flags[0], flags[1]


__all__ = ["MatmulOptions", "MatmulPlanPreferences", "MatmulEpilogPreferences", "MatmulQuantizationScales",
           "HeuristicsLimitError", "as_options", "check_handle", "check_heuristics_limit", "conjugate_flags",
           "qualifiers_dtype", "with_shortcuts", "field"]
