"""``autotune()``: the bridge's plans timed (and searched) on their first run inside the context, and
``python_entries()``: how often XLA called into Python to launch a GEMM.

The state is process-wide, not per thread: XLA runs the callbacks in threads of its own.
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
_entries = [0]


def active() -> Tuning | None:
    """The innermost open ``autotune()`` context, or None."""
    return _active[-1] if _active else None


def count_entry() -> None:
    _entries[0] += 1


def python_entries() -> int:
    """How many times XLA has called into Python to launch one of nvblaslt's GEMMs in this process.

    A jitted step enters Python once per GEMM it runs (``buffer_callback`` is not captured into a
    command buffer); the difference across steps is the count per step.

    Returns
    -------
    int
        The count since the process started.

    Examples
    --------
    >>> import nvblaslt.jax
    >>> nvblaslt.jax.python_entries() >= 0
    True
    """
    return _entries[0]


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
