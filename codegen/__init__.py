"""nvblaslt's binding generator: cublasLt.h -> pure-ctypes Python modules.

Run ``python -m codegen --help``. The pipeline is sources (find the pinned NVIDIA
headers) -> parse (pycparser AST -> model) -> render (jinja2 template); ``pipeline.generate``
runs the last two on one set of headers.
"""

__version__ = "1.1.0"  # 1.1: functions declared for type checkers
