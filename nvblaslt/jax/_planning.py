"""One GEMM as XLA sees it: static operand layouts in, result shapes, dtypes and buffer orders out.

XLA's buffers are row-major. An operand is either its buffer as it is or the buffer's last two axes
swapped (a transposed view: cuBLASLt reads it column-major, no copy). nvblaslt's own rules
(``_problem.canonical``, ``_epilogs.outputs``) say how D and each epilog output are laid out; each
is declared to XLA as the row-major buffer holding that memory, and handed to the caller through
an axis permutation. Everything here runs at trace time, on shapes alone: no GPU, no pointer.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _dtypes, _epilogs
from .._epilogs import SPECS, MatmulEpilog, as_epilog
from .._errors import NvblasltTypeError, NvblasltValueError
from .._frameworks import PROTOCOL
from .._loader import library
from .._operands import Operand
from .._options import MatmulEpilogPreferences, MatmulOptions, MatmulPlanPreferences, as_options, with_shortcuts
from .._problem import Operands, Problem, canonical
from .._scales import Scales
from .._strides import c_strides

# A stand-in pointer for shape-only planning: 256-byte aligned, as XLA's allocations are.
_TRACE_POINTER = 1 << 40


@dataclass(frozen=True)
class Layout:
    """A buffer as XLA holds it (row-major ``shape``), read as itself or with its last two axes swapped."""

    shape: tuple[int, ...]
    dtype: str  # the dtype's name, as nvblaslt and NumPy spell it
    transposed: bool = False

    @property
    def logical_shape(self) -> tuple[int, ...]:
        if not self.transposed:
            return self.shape
        return (*self.shape[:-2], self.shape[-1], self.shape[-2])

    @property
    def logical_strides(self) -> tuple[int, ...]:
        strides = c_strides(self.shape)
        if not self.transposed:
            return strides
        return (*strides[:-2], strides[-1], strides[-2])

    def operand(self, name: str, pointer: int = _TRACE_POINTER, device: int = 0, obj: object = None) -> Operand:
        """This layout as nvblaslt reads an array: the logical shape and element strides at ``pointer``."""
        return Operand(obj, pointer, self.logical_shape, self.logical_strides, dtype_of(self.dtype, name), device,
                       False, PROTOCOL.name)


@dataclass(frozen=True)
class Output:
    """One result as XLA allocates it (a row-major buffer) and as the caller receives it."""

    key: str  # "d", or the epilog output's key ("relu_aux", "drelu_bgrad", …)
    buffer_shape: tuple[int, ...]
    dtype: str
    to_caller: tuple[int, ...]  # the axis permutation that turns the buffer into the caller's array
    attribute: str | None  # the descriptor's pointer attribute the launch writes it through (None: D)


@dataclass(frozen=True)
class Spec:
    """Everything static about one GEMM call: the key of its plans."""

    a: Layout
    b: Layout
    c: Layout | None
    inputs: tuple[tuple[str, Layout], ...]  # epilog inputs, by key
    epilog: MatmulEpilog
    alpha: complex | float | int
    beta: complex | float | int | None
    options: tuple  # MatmulOptions' fields, as (name, value) pairs
    preferences: tuple  # MatmulPlanPreferences' fields as given, (name, value) pairs ("epilog": pairs too)
    scales: tuple  # fp8 scales given as numbers, (key, number) pairs; key "aux": the fp8 aux's
    # fp8 scales given as JAX arrays, by key: their buffers follow the epilog inputs, and the launch reads
    # them through the descriptor's scale pointers (a new value is no new spec, so no new trace or plan)
    scale_arrays: tuple[str, ...] = ()

    def matmul_options(self) -> MatmulOptions:
        return MatmulOptions(**dict(self.options))

    def plan_preferences(self) -> dict | None:
        """The preferences as ``Matmul.plan`` takes them."""
        return preferences_of(self.preferences)

    def plan_scales(self) -> tuple[dict | None, float | None]:
        """(``quantization_scales``, ``aux_quantization_scale``) as the plan takes them: an array's scale
        is planned as 1.0 in the plan's own slot, then pointed at XLA's buffer on every launch."""
        given = {**dict(self.scales), **dict.fromkeys(self.scale_arrays, 1.0)}
        aux = given.pop("aux", None)
        return given or None, aux


def preference_pairs(preferences) -> tuple:
    """``preferences`` (a dict or ``MatmulPlanPreferences``) as hashable (name, value) pairs, static in a
    JAX program; its ``epilog`` (a dict or ``MatmulEpilogPreferences``) as pairs too, the aux type by name."""
    if preferences is None:
        return ()
    if isinstance(preferences, MatmulPlanPreferences):
        preferences = {k: v for k, v in vars(preferences).items() if v != getattr(MatmulPlanPreferences(), k)}
    if not isinstance(preferences, dict):
        raise NvblasltTypeError(f"preferences: expected a dict, got {type(preferences).__name__}")
    found = dict(preferences)
    if "epilog" in found:
        epilog = as_options(MatmulEpilogPreferences, found["epilog"], "preferences.epilog")
        aux_type = epilog.aux_type
        if aux_type is not None and not isinstance(aux_type, str):
            aux_type = _dtypes.parse(aux_type, "preferences.epilog.aux_type").name
        found["epilog"] = (("aux_amax", epilog.aux_amax), ("aux_type", aux_type))
    pairs = tuple(sorted(found.items()))
    try:
        hash(pairs)
    except TypeError:
        raise NvblasltTypeError("preferences: expected hashable values (static in a JAX program)") from None
    return pairs


def preferences_of(pairs: tuple) -> dict | None:
    """``preference_pairs``' pairs as the dict ``Matmul.plan`` takes (None for none)."""
    return {key: dict(value) if key == "epilog" else value for key, value in pairs} or None


def dtype_of(dtype, name: str) -> _dtypes.DType:
    """nvblaslt's DType for a JAX dtype, named by the argument that carries it."""
    return _dtypes.parse(str(dtype), name)


def options_of(options, compute_type, result_type) -> tuple:
    """``options`` with the shortcuts applied, as hashable (name, value) pairs; refused where a JAX
    program cannot use them (XLA owns the stream, the buffers and the device)."""
    checked = with_shortcuts(options, compute_type, result_type)
    for name in ("inplace", "handle", "logger"):
        if getattr(checked, name, None):
            raise NvblasltValueError(f"options.{name}: not available inside JAX (XLA owns the buffers and the "
                                     f"stream); got {getattr(checked, name)!r}")
    pairs = tuple((f, getattr(checked, f)) for f in checked.__dataclass_fields__)
    for key, value in pairs:
        try:
            hash(value)
        except TypeError:
            raise NvblasltTypeError(f"options.{key}: expected a hashable value (a JAX call's options are static), "
                                    f"got {type(value).__name__}") from None
    return pairs


def problem_of(spec: Spec) -> tuple[Problem, _epilogs.Prepared]:
    """nvblaslt's canonical problem for ``spec`` and its epilog prepared on it (outputs, aux type and amax;
    no inputs), from shapes alone: the scales, the amax and the aux type checked as the plan checks them."""
    lib = library()
    options = spec.matmul_options()
    a, b = spec.a.operand("a"), spec.b.operand("b")
    c = spec.c.operand("c") if spec.c is not None else None
    operands = Operands(lib.api, a, b, c, compute_type=options.compute_type, scale_type=options.scale_type,
                        result_type=options.result_type, inplace=False)
    problem = canonical(operands, spec.epilog)
    given = {key: layout.operand(f"epilog_inputs['{key}']") for key, layout in spec.inputs}
    keys = _epilogs.input_keys(spec.epilog, given, problem)
    for key in keys:
        _epilogs.check_input(key, given[key], problem)
    scales, aux_scale = spec.plan_scales()
    # the plan's own checks of the scales (which keys must and may have one), here on numbers: no GPU work
    Scales(problem.types, 0, has_c=spec.c is not None).check(scales, 0)
    if options.result_amax and problem.types.d not in _dtypes.FLOAT8:
        raise NvblasltValueError(f"options.result_amax: result_amax=True is allowed only for narrow-precision "
                                 f"(FP8 and lower) results; the result is {problem.types.d.name}")
    preferences = as_options(MatmulPlanPreferences, spec.plan_preferences(), "preferences")
    aux_dtype = _epilogs.aux_output_type(SPECS[spec.epilog], problem.types, preferences.epilog, aux_scale, {})
    prepared = _epilogs.Prepared(spec.epilog, SPECS[spec.epilog], {},
                                 _epilogs.outputs(SPECS[spec.epilog], problem, _dtypes.UINT8, aux_dtype), aux_dtype,
                                 preferences.epilog.aux_amax)
    return problem, prepared


def row_major_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """The axis order whose row-major buffer has these element strides (axes of extent 1 go last)."""
    axes = range(len(shape))
    if all(n <= 1 or s == e for n, s, e in zip(shape, strides, c_strides(shape))):
        return tuple(axes)
    order = tuple(sorted(axes, key=lambda axis: (-strides[axis] if shape[axis] > 1 else 1, axis)))
    expected = c_strides(tuple(shape[axis] for axis in order))
    if 0 not in shape and any(shape[axis] > 1 and strides[axis] != e for axis, e in zip(order, expected)):
        raise NvblasltValueError(f"result: element strides {strides} of shape {shape} are no permutation of a "
                                 f"row-major layout")
    return order


def outputs_of(spec: Spec) -> tuple[Problem, tuple[Output, ...]]:
    """The problem and every result of ``spec`` (D first) as XLA buffers, in the order ``Results`` makes
    them: D, the epilog's outputs, the fp8 aux's amax, the result's amax."""
    problem, prepared = problem_of(spec)
    found = [_output("d", problem.result_shape, problem.result_strides, problem.types.d, None)]
    found += [_output(o.key, o.shape, o.strides, o.dtype, o.attribute) for o in prepared.outputs]
    attributes = _epilogs.output_pointer_attributes(prepared, spec.matmul_options().result_amax)
    amax_keys = ([f"{prepared.spec.aux_output}_amax"] if prepared.aux_amax else []) + \
        (["result_amax"] if spec.matmul_options().result_amax else [])
    found += [Output(key, (1,), _dtypes.FLOAT32.name, (0,), attribute)
              for key, attribute in zip(amax_keys, attributes[len(prepared.outputs):])]
    return problem, tuple(found)


def scale_attributes(spec: Spec) -> tuple[str, ...]:
    """The descriptor's pointer attribute for each of ``spec.scale_arrays`` (cuBLASLt's A is the caller's B
    where the problem is transposed: so is its scale)."""
    problem, _ = problem_of(spec)
    names = {problem.a.source: "A", problem.b.source: "B", "c": "C", "d": "D"}
    return tuple("EPILOGUE_AUX_SCALE_POINTER" if key == "aux" else f"{names[key]}_SCALE_POINTER"
                 for key in spec.scale_arrays)


def _output(key, shape, strides, dtype, attribute) -> Output:
    order = row_major_order(tuple(shape), tuple(strides))
    inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return Output(key, tuple(shape[axis] for axis in order), dtype.name, inverse, attribute)


def epilog_of(epilog) -> MatmulEpilog:
    return as_epilog(epilog)
