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
from .._options import MatmulOptions, with_shortcuts
from .._problem import Operands, Problem, canonical
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
    preferences: tuple  # MatmulPlanPreferences' fields as given, (name, value) pairs
    scales: tuple  # quantization scales, (key, number) pairs

    def matmul_options(self) -> MatmulOptions:
        return MatmulOptions(**dict(self.options))


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


def problem_of(spec: Spec) -> tuple[Problem, list]:
    """nvblaslt's canonical problem for ``spec`` and its epilog outputs, from shapes alone."""
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
    aux_dtype = problem.types.d if SPECS[spec.epilog].aux_output == "gelu_aux" else None
    return problem, _epilogs.outputs(SPECS[spec.epilog], problem, _dtypes.UINT8, aux_dtype)


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
    """The problem and every result of ``spec`` (D first) as XLA buffers."""
    problem, epilog_outputs = problem_of(spec)
    found = [_output("d", problem.result_shape, problem.result_strides, problem.types.d, None)]
    found += [_output(o.key, o.shape, o.strides, o.dtype, o.attribute) for o in epilog_outputs]
    return problem, tuple(found)


def _output(key, shape, strides, dtype, attribute) -> Output:
    order = row_major_order(tuple(shape), tuple(strides))
    inverse = tuple(sorted(range(len(order)), key=order.__getitem__))
    return Output(key, tuple(shape[axis] for axis in order), dtype.name, inverse, attribute)


def epilog_of(epilog) -> MatmulEpilog:
    return as_epilog(epilog)
