"""JAX as a first-class user: nvblaslt's fused GEMMs inside ``jax.jit``, differentiable.

``matmul`` is ``nvblaslt.matmul`` for JAX arrays on a CUDA GPU, usable under ``jit``, ``grad``
and ``vmap``; ``dense`` a stack of fused Dense + activation layers whose backward runs the
activations' backward epilogs (DGELU, DRELU_BGRAD, …) and the bias-gradient epilogs; ``ragged_dot`` ``jax.lax.ragged_dot`` on cuBLASLt's grouped
GEMM (cuBLASLt 13.4 or newer). Each GEMM is one XLA call (``jax.experimental.buffer_callback``) on XLA's stream,
writing D and the epilog's outputs straight into XLA's buffers; shapes come from nvblaslt's own
rules at trace time, plans are made on the first run and kept. Imported only by those who ask.

Modules, each calling only those below it: ``_dense`` (layer stacks) → ``_matmul`` (the public function and its gradient) →
``_gemm`` (checks, the static spec, caller layouts) → ``_bridge`` (the primitive, its lowering,
vmap rule and launch, per GPU; ``_ragged`` → ``_ragged_launch`` for ``ragged_dot``) → ``_planning`` (shapes from nvblaslt's rules, no GPU) and ``_tuning``
(``autotune()``, ``command_buffers()`` and the Python-entry count). ``nvblaslt.jax.nn`` (flax layers) is imported only on request.
"""

from __future__ import annotations

from ._dense import dense
from ._matmul import matmul
from ._ragged import ragged_dot
from ._ragged_launch import clear_plans
from ._tuning import autotune, command_buffers, python_entries

__all__ = ["autotune", "clear_plans", "command_buffers", "dense", "matmul", "python_entries", "ragged_dot"]

for _public in (autotune, clear_plans, command_buffers, dense, matmul, python_entries, ragged_dot):
    _public.__module__ = __name__
del _public
