"""The arrays a plan reads: its operands at construction, its epilog inputs at plan time, and new
ones on ``reset_operands``, read and compared with what the plan was made for before anything of
the plan changes (a refused reset changes nothing)."""

from __future__ import annotations

from . import _operands
from ._epilogs import check_input
from ._errors import NvblasltArgumentError, NvblasltTypeError, NvblasltValueError
from ._frameworks import Framework, framework_of
from ._streams import stream_handle


def read_operands(a, b, c, stream) -> tuple[list, Framework, int | None]:
    """(a, b, c as read, their package, the stream given or None): the constructor's reading."""
    for name, x in (("a", a), ("b", b)):
        if x is None:
            raise NvblasltTypeError(f"{name}: expected an array, got None")
    given = [(x, name) for x, name in ((a, "a"), (b, "b"), (c, "c")) if x is not None]
    framework = one_package(given)
    stream_h = stream_handle(stream) if stream is not None else None
    if stream_h is not None:
        read_stream = stream_h
    elif _operands.is_host_array(a):
        read_stream = 0  # host operands: no framework stream to ask (nor, on CPU-only builds, one to have)
    else:
        read_stream = framework.stream_getter(None)()
    return [_operands.read(x, name, read_stream) for x, name in given], framework, stream_h


def one_package(given: list) -> Framework:
    """The package of the ``(array, name)`` pairs given, which must be one."""
    frameworks = {name: framework_of(x) for x, name in given}
    if len(set(frameworks.values())) > 1:
        raise NvblasltTypeError(f"a, b, c: All tensors must be from the same library (one array package), got "
                                f"{', '.join(f'{n}: {k}' for n, k in frameworks.items())}")
    return frameworks[given[0][1]]


def _place(host: bool, device: int) -> str:
    return "cpu (host memory)" if host else f"cuda:{device}"


def read_input(key: str, value, host: bool, device: int, stream: int) -> _operands.Operand:
    """One epilog input as read, in the operands' memory space (host inputs are staged by the plan,
    once they are checked)."""
    name = f"epilog_inputs['{key}']"
    op = value if isinstance(value, _operands.Operand) else _operands.read(value, name, stream)
    if op.host != host:
        raise NvblasltArgumentError(f"{name}: The operand {key} is on device {_place(op.host, op.device)}, but it "
                                    f"should be on device {_place(host, device)} (the operands')")
    if not op.host and op.device != device:
        raise NvblasltValueError(f"{name}: on GPU {op.device}, but the operands are on GPU {device}")
    return op


# What a reset's operand must share with the one it replaces, in nvmath-python's words where it has them
_SAME = {"shape": "The extents {new} of the new operand must match the extents {old} the plan was made for",
         "strides": "The strides {new} of the new operand must match the strides {old} the plan was made for",
         "dtype": "The data type of the new operand must match the data type of the original operand. The plan was "
                  "made for {old}, got {new}",
         "device": "The new operand is on device {new}, but it should be on device {old}",
         "conjugated": "the plan was made for conjugated={old}, got {new}"}


def require_same(name: str, old, new, what_matters=("shape", "strides", "dtype", "device", "conjugated"),
                 remedy: str = "make a new Matmul for a different problem") -> None:
    for what in what_matters:
        if getattr(old, what) != getattr(new, what):
            mismatch = _SAME[what].format(old=getattr(old, what), new=getattr(new, what))
            raise NvblasltValueError(f"{name}: {mismatch}; {remedy}")
    if "device" in what_matters and new.alignment < old.alignment:
        raise NvblasltValueError(f"{name}: pointer 0x{new.ptr:x} is aligned to {new.alignment} bytes, but the "
                                 f"plan's algorithms assume {old.alignment}; make a new Matmul")


def read_reset(new: dict, current: dict, host_originals: dict, released, framework: Framework, host: bool,
               stream: int, checked: bool = True) -> dict:
    """{name: Operand} for the new a, b, c given (None: keep), each like the one it replaces; with
    ``checked=False`` (``reset_operands_unchecked``) the caller promises that, and GPU operands are
    only read."""
    if released:  # the a, b, c of the names dropped (the epilog inputs' are checked with them)
        missing = sorted(n for n in released if n in new and new.get(n) is None)
        if missing:
            raise NvblasltValueError(f"{', '.join(missing)}: release_operands() dropped the operands; give all "
                                     f"of them again")
    found = {}
    for name, array in new.items():
        if array is None:
            continue
        old = current[name]
        if old is None:
            raise NvblasltValueError(f"{name}: the plan was made without {name}; make a new Matmul")
        op = _operands.read(array, name, stream)
        if not checked and not host and not op.host and op.device == old.device:  # GPU arrays taken on trust
            found[name] = op
            continue
        if framework_of(array) is not framework or op.host != host:
            raise NvblasltTypeError(f"{name}: Library package mismatch: expected an array like the original "
                                    f"({framework}, {'host' if host else 'GPU'} memory)")
        if op.host:  # copied (conjugated, for a conjugate view) into the device copy's layout: any strides do
            require_same(name, host_originals[name], op, ("shape", "dtype"))
        else:
            require_same(name, old, op)
        found[name] = op
    return found


def read_reset_inputs(epilog_inputs: dict, planned: bool, epilog, checked: dict, staged: dict, problem,
                      host: bool, stream: int) -> dict:
    """{key: (Operand, its EpilogInput, or None for a host input copied into its staged copy)}."""
    if not planned:
        raise NvblasltValueError("epilog_inputs: call plan() before resetting epilog inputs")
    unknown = [k for k in epilog_inputs if k not in checked]
    if unknown:
        raise NvblasltValueError(f"epilog_inputs: {epilog.name} takes {list(checked)}; unknown {unknown}")
    found: dict[str, tuple] = {}
    for key, value in epilog_inputs.items():
        name = f"epilog_inputs['{key}']"
        op = _operands.read(value, name, stream)
        package = staged[key].framework  # the input's own package (plan() takes one unlike the operands')
        if framework_of(value) is not package:
            raise NvblasltTypeError(f"{name}: Library package mismatch: expected an array like the original "
                                    f"({package}); got one of {framework_of(value)}")
        if op.host != host:
            raise NvblasltArgumentError(f"{name}: The operand {key} is on device {_place(op.host, op.device)}, but it "
                                        f"should be on device {_place(host, staged[key].device)} (the plan's)")
        if not op.host and op.device != staged[key].device:
            raise NvblasltValueError(f"{name}: on GPU {op.device}, but the plan is on GPU {staged[key].device}")
        original, remedy = staged[key], "call plan() again with it"
        if op.host:  # copied into the plan's device copy, in its layout: any strides do
            require_same(name, original, op, ("shape", "dtype"), remedy)
            found[key] = (op, None)
            continue
        if op.dtype != original.dtype:  # an argument error, as plan()'s dtype refusals (another shape may be fine)
            raise NvblasltArgumentError(f"{name}: {_SAME['dtype'].format(old=original.dtype, new=op.dtype)}; {remedy}")
        old, new = checked[key], check_input(key, op, problem)
        if (new.ld, new.batch_stride) != (old.ld, old.batch_stride):
            raise NvblasltValueError(f"{name}: The extents {op.shape} and strides {op.strides} of the new operand must "
                                     f"match the layout the plan was made for (extents {original.shape}, strides "
                                     f"{original.strides}); {remedy}")
        if new.alignment < old.alignment:
            raise NvblasltValueError(f"{name}: pointer 0x{new.ptr:x} is aligned to {new.alignment} bytes, but the "
                                     f"plan assumed {old.alignment}")
        found[key] = (op, new)
    return found
