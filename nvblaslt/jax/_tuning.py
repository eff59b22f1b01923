"""The host path's switches and counts: ``autotune()`` (the bridge's plans timed, and searched, on their
first run inside the context), ``command_buffers()`` (the GEMMs lowered inside it may be captured
into XLA's command buffers) and ``python_entries()`` (how often XLA called into Python to launch a
GEMM, per GPU).

The state is process-wide, not per thread: XLA runs the callbacks in threads of its own (one per
GPU under ``shard_map``), so counts are taken under a lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from .._autotune import tuning_iterations
from .._errors import NvblasltTypeError


@dataclass(frozen=True)
class Tuning:
    """One ``autotune()`` context: its settings and its generation (a plan made in an older one is made again)."""

    iterations: int
    search: bool
    generation: int


_lock = threading.Lock()
_generations = [0]
_active: list[Tuning] = []  # the open contexts, innermost last
_entries: dict[int, int] = {}  # GPU ordinal → Python entries that launched a GEMM there
_capturable = [0]  # open command_buffers() contexts


def active() -> Tuning | None:
    """The innermost open ``autotune()`` context, or None."""
    return _active[-1] if _active else None


def count_entry(device: int) -> None:
    with _lock:  # callbacks of two GPUs may run at once; `+=` on shared state is no atomic step
        _entries[device] = _entries.get(device, 0) + 1


def python_entries(device: int | None = None) -> int:
    """How many times XLA has called into Python to launch one of nvblaslt's GEMMs in this process.

    A jitted step enters Python once per GEMM it runs; a program lowered inside
    ``command_buffers()`` enters it only while XLA records its command buffer, and not when the
    buffer is replayed. The difference across steps is the count per step.

    Parameters
    ----------
    device : int, optional
        Count only the launches on this GPU (its CUDA ordinal); default every GPU's.

    Returns
    -------
    int
        The count since the process started.

    Raises
    ------
    NvblasltTypeError
        ``device`` is not an int.

    Examples
    --------
    >>> import nvblaslt.jax
    >>> nvblaslt.jax.python_entries() >= nvblaslt.jax.python_entries(device=0) >= 0
    True
    """
    if device is None:
        with _lock:
            return sum(_entries.values())
    if isinstance(device, bool) or not isinstance(device, int):
        raise NvblasltTypeError(f"device: expected a GPU ordinal (int) or None, got {type(device).__name__}")
    with _lock:
        return _entries.get(device, 0)


def capturable() -> bool:
    """Whether a GEMM traced now may be captured into a command buffer (inside ``command_buffers()``)."""
    return _capturable[0] > 0


def command_buffers() -> contextlib.AbstractContextManager[None]:
    """Let XLA capture the nvblaslt GEMMs traced inside the context into its command buffers.

    Each GEMM is then a ``buffer_callback(..., command_buffer_compatible=True)``: XLA runs a
    program's first execution op by op (the plans are made then, on XLA's stream), then records
    the command buffer once, calling into Python under stream capture, and replays it on later
    steps with no Python at all (``python_entries()`` stops growing). XLA records again, entering
    Python again, when the buffers' addresses change. Whether XLA makes command buffers at all is
    its own choice: ``XLA_FLAGS=--xla_gpu_enable_command_buffer=…`` must include ``CUSTOM_CALL``
    (XLA's default does), and a run of fewer than ``--xla_gpu_graph_min_graph_size`` capturable
    operations (default 5) stays op by op.

    What counts is where a GEMM is traced: the choice is recorded in the traced program. ``jax.jit``
    traces on a function's first call and keeps the trace, so trace a function inside the context
    that was not traced outside it. A plan a command buffer captured is kept for the process's life
    (a replay still reads its workspace): ``clear_plans()`` and a later ``autotune()`` leave it.
    ``ragged_dot`` is captured the same way: its group sizes stay on the GPU, and its call allocates
    and waits for nothing once its first run has planned it.

    Returns
    -------
    contextlib.AbstractContextManager[None]
        The context to trace programs in; contexts nest.

    Examples
    --------
    On a GPU:

    .. code-block:: python

        with nvblaslt.jax.command_buffers():
            step = jax.jit(train_step)
            state = step(state, batch)        # traced here: its GEMMs may be captured
        for batch in batches:
            state = step(state, batch)        # after the first two steps, no Python per GEMM
    """
    return _capturing()


@contextlib.contextmanager
def _capturing() -> Iterator[None]:
    with _lock:
        _capturable[0] += 1
    try:
        yield
    finally:
        with _lock:
            _capturable[0] -= 1


def autotune(*, search: bool = True, iterations: int = 5) -> contextlib.AbstractContextManager[None]:
    """Time every nvblaslt GEMM that a JAX program runs inside the context, on its first run there.

    A plan made inside the context is timed as ``Matmul.autotune`` times it, on XLA's stream
    with XLA's buffers (results go to scratch memory, the step's results are untouched): the
    heuristics' list, and with ``search`` configurations beyond it, the winner remembered on disk
    (the tuning cache). Plans made before the context are made again on their next run inside it;
    plans made inside it are kept after it. Later processes recall the winners from the disk.

    Run one step inside it, and wait for its results there (``block_until_ready``: JAX dispatches
    asynchronously, and a GEMM that first runs after the context closed is not timed). That step is
    slower (a search takes up to about 10 seconds per distinct GEMM); the later ones run the winners. XLA autotunes its
    own ``jnp.dot`` kernels when it compiles, so a fair comparison with XLA tunes nvblaslt's too.

    Parameters
    ----------
    search : bool, default True
        Also search beyond the heuristics' list (``Matmul.autotune(search=True)``); False times
        the heuristics' list alone (a second or so per GEMM).
    iterations : int, default 5
        Timed rounds per candidate, an int ≥ 1.

    Returns
    -------
    contextlib.AbstractContextManager[None]
        The context to run a step in; contexts nest, the innermost one applies.

    Raises
    ------
    NvblasltTypeError, NvblasltValueError
        ``iterations`` is not an int ≥ 1, or ``search`` not a bool.

    Examples
    --------
    On a GPU:

    .. code-block:: python

        step = jax.jit(train_step)
        with nvblaslt.jax.autotune():
            state = jax.block_until_ready(step(state, batch))   # every GEMM timed and searched here
        for batch in batches:
            state = step(state, batch)        # the winners, recalled
    """
    count = tuning_iterations(iterations)
    if not isinstance(search, bool):
        raise NvblasltTypeError(f"search: expected a bool, got {type(search).__name__}")
    return _context(count, search)


@contextlib.contextmanager
def _context(iterations: int, search: bool) -> Iterator[None]:
    with _lock:
        _generations[0] += 1
        tuning = Tuning(iterations, search, _generations[0])
        _active.append(tuning)
    try:
        yield
    finally:
        with _lock:
            _active.remove(tuning)
