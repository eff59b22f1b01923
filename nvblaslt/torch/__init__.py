"""PyTorch as a first-class user: a fused ``Linear`` (+ bias, + ReLU or tanh-GELU) that trains.

``linear(x, weight, bias=None, activation=None)`` is ``nn.functional.linear`` followed by the
activation, as one cuBLASLt call; ``FusedLinear`` is the ``nn.Module`` with ``nn.Linear``'s
parameters, init and ``state_dict`` keys; ``fuse(model)`` turns ``nn.Sequential(Linear, ReLU, …)``
stacks into a ``FusedSequential`` of them. Both are torch custom ops (``torch.ops.nvblaslt.linear``
and ``linear_backward``) with fake implementations and a registered autograd formula, so they work
under ``torch.compile(fullgraph=True)``, in CUDA graphs and with ``gradcheck``. On CUDA the GEMMs
are nvblaslt's; on any other device the same math runs as torch ops. ``autotune()`` searches the
GEMMs' plans; ``BACKWARDS`` / ``AUTO_BACKWARD`` are where a ``FusedSequential`` runs each activation's
backward (see its ``backward``).

GELU here is cuBLASLt's tanh form; exact (erf) GELU is refused, never approximated.

Modules, each calling only those below it: ``_layers`` (the ``nn.Module`` s and ``fuse``) →
``_functional`` (``linear``, argument checks) → ``_ops`` (the custom ops, fake implementations,
autograd formula, and how the layers link) → ``_gemms`` (each step as an nvblaslt GEMM with its epilog,
mapping documented there) → ``_composite`` (the same math as torch ops; the layouts all share);
``_tuning`` (``autotune``, the backward forms) beside them. In plain eager mode on CUDA, the pointwise
convolution's step and a forward no backward pass follows run on ``_pointwise``'s bound GEMMs
(``_bound``: planned once, launched with pointers alone) instead of ``matmul()``.
"""

from __future__ import annotations

from ._conv import FusedConv2d, conv2d
from ._functional import linear
from ._grouped import GroupedLinear, grouped_mm
from ._layers import FusedLinear, FusedSequential, fuse
from ._tuning import AUTO_BACKWARD, BACKWARDS, autotune

__all__ = ["AUTO_BACKWARD", "BACKWARDS", "FusedConv2d", "FusedLinear", "FusedSequential", "GroupedLinear", "autotune",
           "conv2d", "fuse", "grouped_mm", "linear"]

for _public in (FusedConv2d, FusedLinear, FusedSequential, GroupedLinear, autotune, conv2d, fuse, grouped_mm,
                linear):
    _public.__module__ = __name__  # as before the split: reprs, and pickles of whole models, name nvblaslt.torch
del _public
