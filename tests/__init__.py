"""nvblaslt's tests, by kind: cpu, gpu, codegen, fuzz, stress, differential. A package, so that every group
and every script imports the shared helpers as ``tests.reference`` and ``tests.fakes``; run the scripts as modules
from the repository root (``python -m tests.stress.gpu_stress``).
"""
