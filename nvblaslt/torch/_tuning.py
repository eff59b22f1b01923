"""What runs fastest: ``autotune()`` searches the fused layers' GEMMs; ``BACKWARDS`` and
``AUTO_BACKWARD`` say where a ``FusedSequential`` runs each activation's backward; ``invariant()``
makes the forward GEMMs batch-invariant (``MatmulOptions.batch_invariant``) while it is open."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from .. import MatmulOptions, NvblasltTypeError, NvblasltValueError
from .._autotune import tuning_iterations

BACKWARDS: tuple[str, ...] = ("auto", "unfused", "bgradb", "epilog")
"""The values ``FusedSequential(backward=…)`` and ``fuse(…, backward=…)`` take: where each layer's
activation backward and bias gradient run (see ``FusedSequential``)."""
# What "auto" picks, from the training-step bench (H200, cuBLASLt 13.1, bf16, 8192 tokens, widths 4096/16384):
# cuBLASLt runs DRELU, DRELU_BGRAD and DGELU_BGRAD there as the GEMM plus a separate epilogue kernel
# (0.2-0.75 ms a call, slower than torch's threshold_backward or a row sum), while DGELU is fused into the
# GEMM (+2-5 %) and BGRADB costs nothing or one short reduction kernel.
AUTO_BACKWARD: dict[str, str | None] = {"none": None, "relu": None, "gelu": "bgradb"}
"""{activation: the backward form ``backward="auto"`` picks for it}; None stands for ``"unfused"``."""


def check_backward(value: str) -> str:
    """``value`` if it is one of ``BACKWARDS``, else NvblasltValueError."""
    if value not in BACKWARDS:
        raise NvblasltValueError(f"backward: expected one of {BACKWARDS}, got {value!r}")
    return value


def chain_for(backward: str, activation: str) -> str | None:
    """Where a linked layer's activation backward runs (``layer()``'s ``chain``): None for its own
    backward ("unfused"), else ``"bgradb"`` or ``"epilog"``, with "auto" resolved by ``AUTO_BACKWARD``."""
    if backward == "auto":
        return AUTO_BACKWARD[activation]
    return None if backward == "unfused" else backward


_active: dict[str, Any] | None = None  # the innermost autotune() context's settings


def autotune(*, iterations: int = 5) -> contextlib.AbstractContextManager[None]:
    """Search the fused layers' GEMMs for their fastest plans while the context is open.

    Every GEMM the fused layers run inside the context is searched as ``Matmul.autotune(search=True)``
    searches: the heuristics' list, configurations beyond it, and for DRELU_BGRAD / DGELU_BGRAD the
    two-call form. The winners are remembered on disk, so that later plans of the same problems start
    from them. Each distinct problem is searched once per context (layers of one shape share the winner).

    ``grouped_mm`` (and so ``GroupedLinear``) problems are searched the same way, from up to 16 of the
    heuristics' algorithms (``GroupedMatmul.autotune(search=True)``), and its cached plans recall the
    winner. Tuning times each candidate into scratch
    memory of the result's size, beside the largest workspace among them: a step that barely fits the
    GPU may not fit while it is tuned.

    Run one training step inside it before the first ordinary step: the GEMMs run as usual, only
    slower. Plans that ``nvblaslt.matmul`` cached before (a warm-up step's, in any thread, the autograd
    engine's included) are made again on their next call and recall the winners; a new process picks
    them up from the disk. It matters: on the bench's MLP
    (H200, bf16, 8192 tokens) the heuristics' first picks leave the fused step 1.05× (ReLU) / 1.09×
    (GELU) the GEMM-only floor, searched plans 1.01× / 1.03× (``python -m nvblaslt.bench.mlp --search``).
    Outside CUDA (CPU tensors run as torch ops) the context changes nothing.

    Parameters
    ----------
    iterations : int, default 5
        Timed rounds per candidate, an int ≥ 1 (checked here, not at ``with``).

    Returns
    -------
    contextlib.AbstractContextManager[None]
        The context to run a training step in; contexts nest, the innermost one applies.

    Raises
    ------
    NvblasltTypeError
        ``iterations`` is not an integer (bools included).
    NvblasltValueError
        ``iterations`` is below 1.

    See Also
    --------
    nvblaslt.Matmul.autotune : the search, on one plan.

    Examples
    --------
    >>> import torch
    >>> from nvblaslt.torch import FusedLinear, autotune
    >>> layer = FusedLinear(8, 4, activation="relu")
    >>> with autotune(iterations=3):
    ...     loss = layer(torch.ones(2, 8)).sum()
    ...     loss.backward()
    >>> autotune(iterations=0)
    Traceback (most recent call last):
        ...
    nvblaslt._errors.NvblasltValueError: iterations: expected an int ≥ 1 (timed rounds per candidate), got 0
    """
    count = tuning_iterations(iterations)
    return _autotune(count)


@contextlib.contextmanager
def _autotune(iterations: int) -> Iterator[None]:
    global _active
    previous, _active = _active, {"iterations": iterations, "searched": set()}
    try:
        yield
    finally:
        _active = previous


def tuning() -> bool:
    """Whether an ``autotune()`` context is open (a GEMM outside one asks nothing more)."""
    return _active is not None


def first_search(problem: Callable[[], Hashable]) -> int | None:
    """The iterations to search a problem with, when an ``autotune()`` context is active and has not
    searched it yet (it is then marked searched); None otherwise. ``problem()`` gives the problem's key,
    called only inside a context: the GEMMs outside pay nothing for it."""
    tuning = _active
    if tuning is None:
        return None
    key = problem()
    if key in tuning["searched"]:
        return None
    tuning["searched"].add(key)
    iterations: int = tuning["iterations"]
    return iterations


# ---- batch invariance ---------------------------------------------------------------------------------------
# The options of a batch-invariant GEMM, by which of the caller's extents holds the tokens: made once (each
# call copies them, which checks nothing new).
_INVARIANT_OPTIONS = {extent: MatmulOptions(batch_invariant=extent) for extent in ("rows", "columns")}


class _Depth(threading.local):
    """The thread's depth of open invariant(True) contexts: 0 from a thread's first read (a default
    through getattr raises and catches AttributeError inside, a third of a µs on every hot call)."""

    def __init__(self) -> None:
        self.depth = 0


_invariant = _Depth()


def check_switch(value: object) -> bool:
    """``value`` if it is a bool, else NvblasltTypeError: the ``batch_invariant=`` of the torch entries."""
    if not isinstance(value, bool):
        raise NvblasltTypeError(f"batch_invariant: expected a bool, got {value!r}")
    return value


@contextlib.contextmanager
def invariant(enabled: bool) -> Iterator[None]:
    """While open with ``enabled``, the fused layers' forward GEMMs in this thread pin one algorithm for
    every token count. The custom ops run their implementation in the caller's thread (eagerly, and when a
    compiled graph runs), so a context around the call reaches them; the backward runs in autograd's."""
    if not enabled:
        yield
        return
    _invariant.depth += 1
    try:
        yield
    finally:
        _invariant.depth -= 1


def contexts_open() -> bool:
    """Whether an ``autotune()`` or an ``invariant(True)`` context is open in this thread: one query for
    the hot paths whose plans are not the ones those contexts make."""
    return _active is not None or _invariant.depth > 0


def invariant_options(tokens: str | None) -> MatmulOptions | None:
    """The options of a GEMM whose ``tokens`` ("rows" or "columns" of its result; None: K, as in a weight
    gradient) vary with the batch, inside an ``invariant(True)`` context; None otherwise."""
    if tokens is None or not _invariant.depth:
        return None
    return _INVARIANT_OPTIONS[tokens]
