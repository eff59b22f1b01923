"""``fuse(…, sample=x)``: convert a convolution only where the fused step is measured no slower.

Whether a ``FusedConv2d`` beats cuDNN's convolution + activation depends on the shape and on the
host: a small layer's step is the time to issue it, and a loop that waits for each step (one that
logs its loss) pays all of it. So with a sample input, ``fuse()`` runs the model once on it, keeps
each candidate convolution's own input, and times that layer both ways on it, each step followed by
a synchronize, as such a loop runs: forward and backward when the model is training (the gradients
through ``torch.autograd.grad``, so no ``.grad`` of the model's is touched), the forward alone
under ``torch.no_grad()`` when it is evaluating. A layer is converted only where the fused median
is at most the eager one; the times are logged (``logging.getLogger("nvblaslt")``, INFO).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

logger = logging.getLogger("nvblaslt")  # nvblaslt's own logger (its handlers and level are the user's)
Candidate = tuple[nn.Conv2d, nn.Module, str]  # (convolution, its activation module, the activation's name)

ROUNDS = 7  # interleaved rounds, eager and fused alternating; the medians are compared
STEPS = 5  # steps per round (each synchronized), after one warm-up step of each


_clock: Callable[[], float] = time.perf_counter  # the tests' simulated clock replaces it


def paying(module: nn.Module, sample: Any, candidates: list[Candidate],
           make: Callable[[nn.Conv2d, str], nn.Module]) -> set[int]:
    """The ``id``s of the candidate convolutions whose fused step (``make(conv, activation)``) is measured
    no slower than the convolution + activation on the input ``module(sample)`` gives each of them.
    A candidate the sample never reaches is left as it is (not in the set)."""
    inputs = _inputs_seen(module, sample, [conv for conv, _, _ in candidates])
    chosen = set()
    for conv, activation_module, activation in candidates:
        x = inputs.get(id(conv))
        if x is None:
            logger.info("fuse: %s is not reached by the sample; left unfused", conv)
            continue
        fused = make(conv, activation)
        eager = nn.Sequential(conv, activation_module)
        eager_s, fused_s = _medians(eager, fused, x, conv.training, _clock)
        keep = fused_s <= eager_s
        logger.info("fuse: %s + %s on %s %s: eager %.1f µs, fused %.1f µs per synchronized step: %s", conv,
                    activation, tuple(x.shape), x.dtype, eager_s * 1e6, fused_s * 1e6,
                    "fused" if keep else "left unfused")
        if keep:
            chosen.add(id(conv))
    return chosen


def _inputs_seen(module: nn.Module, sample: Any, convs: list[nn.Conv2d]) -> dict[int, Tensor]:
    """Each convolution's input in one run of ``module`` on ``sample`` (a tensor, or a tuple of arguments),
    without recording a graph."""
    seen: dict[int, Tensor] = {}

    def keep(conv: nn.Module, args: tuple) -> None:
        if args and isinstance(args[0], Tensor):
            seen.setdefault(id(conv), args[0].detach())

    hooks = [conv.register_forward_pre_hook(keep) for conv in convs]
    try:
        with torch.no_grad():
            module(*sample) if isinstance(sample, tuple) else module(sample)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def _medians(eager: nn.Module, fused: nn.Module, x: Tensor, training: bool,
             clock: Callable[[], float]) -> tuple[float, float]:
    """The median seconds of one synchronized step of each, in interleaved rounds."""
    steps = [_step(layer, x, training) for layer in (eager, fused)]
    for step in steps:  # warm-up: plans, cuDNN's algorithm choice, the caching allocator
        step()
    _synchronize(x)
    times: list[list[float]] = [[], []]
    for round_index in range(ROUNDS):
        order = (0, 1) if round_index % 2 == 0 else (1, 0)
        for which in order:
            for _ in range(STEPS):
                start = clock()
                steps[which]()
                _synchronize(x)
                times[which].append(clock() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def _step(layer: nn.Module, x: Tensor, training: bool) -> Callable[[], None]:
    """One step of ``layer`` on ``x``: forward and backward (to x and the parameters) when training."""
    if not training:
        def forward() -> None:
            with torch.no_grad():
                layer(x)
        return forward
    source = x.detach().requires_grad_()
    wrt = [source, *(p for p in layer.parameters() if p.requires_grad)]
    upstream: list[Tensor] = []

    def train() -> None:
        out = layer(source)
        if not upstream:  # the same upstream gradient every step, made once
            upstream.append(torch.randn_like(out))
        torch.autograd.grad(out, wrt, upstream[0])
    return train


def _synchronize(x: Tensor) -> None:
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def candidates_in(module: nn.Module, is_candidate: Callable[[nn.Module], bool],
                  activation_of: Callable[[nn.Module, str], str | None]) -> Iterator[Candidate]:
    """Every (convolution, activation module, activation) pair ``fuse(convolutions=True)`` would convert:
    in an ``nn.Sequential``, a candidate convolution directly followed by a fusable activation."""
    for where, sequential in module.named_modules():
        if not isinstance(sequential, nn.Sequential):
            continue
        slots = [child for name, child in sequential.named_modules(remove_duplicate=False)
                 if name and "." not in name]
        for child, after in zip(slots, slots[1:]):
            if is_candidate(child) and (activation := activation_of(after, where or "module")):
                yield child, after, activation
