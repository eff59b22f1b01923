"""``NVBLASLT_RECORD=path``: every distinct problem this process plans, one JSON line each, so that a
real run's problems can be tuned later (``nvblaslt tune --problems path``).

A line says what ``Matmul(a, b, c, options=…).plan(epilog=…, epilog_inputs=…)`` was given, as
layouts (shape, element strides, dtype) and names, never the arrays: ``{"kind": "matmul", "a": {...},
"b": {...}, "c": {...} or null, "epilog": "RELU_BIAS", "inputs": {"bias": {...}}, "options": {...}}``.
Lines are appended (one ``write`` each, so processes writing one file do not interleave); a line already
in the file when the process first records is not written again. Recording never breaks a plan: a file
that cannot be written is said once, as a warning, and recording stops.
"""

from __future__ import annotations

import json
import os
import threading
import warnings

ENV_RECORD = "NVBLASLT_RECORD"

_seen: dict[str, set[str]] = {}  # path -> the lines in it
_failed: set[str] = set()
_lock = threading.Lock()


class RecordWarning(UserWarning):
    """``$NVBLASLT_RECORD`` could not be written; planning goes on without recording."""


def array_spec(operand) -> dict:
    return {"shape": list(operand.shape), "strides": list(operand.strides), "dtype": operand.dtype.name}


def spec_of(plan, epilog, inputs: dict) -> dict:
    """The recorded form of ``plan``'s problem (a planned ``Matmul``; ``inputs``: its epilog inputs as read)."""
    operands, types = plan._problem_operands, plan._problem.types
    c = operands.c.op if operands.c is not None else None
    options = {"compute_type": types.compute, "scale_type": types.scale}
    if c is None:
        options["result_type"] = types.d.name
    if plan._options.batch_invariant:
        options["batch_invariant"] = plan._options.batch_invariant
    return {"kind": "matmul", "a": array_spec(operands.a.op), "b": array_spec(operands.b.op),
            "c": array_spec(c) if c is not None else None, "epilog": epilog.name,
            "inputs": {key: array_spec(operand) for key, operand in sorted(inputs.items())}, "options": options}


def note(plan, epilog, inputs: dict) -> None:
    """Record ``plan``'s problem where ``$NVBLASLT_RECORD`` names a file; otherwise nothing."""
    path = os.environ.get(ENV_RECORD)
    if not path or path in _failed:
        return
    try:
        line = json.dumps(spec_of(plan, epilog, inputs), sort_keys=True)
        with _lock:
            seen = _seen.get(path)
            if seen is None:
                seen = _seen[path] = _lines_in(path)
            if line in seen:
                return
            seen.add(line)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
    except Exception as error:  # noqa: BLE001 - recording must never break a plan
        _failed.add(path)
        warnings.warn(f"{ENV_RECORD}={path}: cannot record ({error}); planning goes on without recording",
                      RecordWarning, stacklevel=4)


def _lines_in(path: str) -> set[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return {line.rstrip("\n") for line in file}
    except FileNotFoundError:
        return set()


def read_problems(path: str | os.PathLike) -> list[dict]:
    """The problems recorded in ``path``; NvblasltValueError naming the line of one that is not a problem."""
    from ._errors import NvblasltValueError

    problems = []
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise NvblasltValueError(f"problems {os.fspath(path)}: cannot be read ({error})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            problem = json.loads(line)
        except ValueError as error:
            raise NvblasltValueError(f"problems {os.fspath(path)}: line {number}: not valid JSON ({error})") from None
        if not isinstance(problem, dict) or problem.get("kind") not in ("matmul", "grouped") or \
                not isinstance(problem.get("a"), dict) or not isinstance(problem.get("b"), dict):
            raise NvblasltValueError(f"problems {os.fspath(path)}: line {number}: expected a recorded problem "
                                     f'({{"kind": "matmul", "a": {{...}}, "b": {{...}}, ...}}), got {line[:80]!r}')
        problems.append(problem)
    return problems
