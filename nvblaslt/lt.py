"""The whole C API of cublasLt.h, as generated for the loaded library's version.

Enums, structs, handle types and ``#define`` constants come from the generated module
(``nvblaslt._generated.cublaslt_NN``); functions are bound to the libcublasLt that
nvblaslt found, each with argtypes/restype and a status check raising ``CublasLtError``::

    from nvblaslt import lt
    desc = lt.cublasLtMatmulDesc_t()
    lt.cublasLtMatmulDescCreate(ctypes.byref(desc), lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)

Importing this module loads the library.
"""

from . import _attributes
from ._loader import library as _library

_lib = _library()
library_path = _lib.path
library_version = _lib.version

globals().update({k: v for k, v in vars(_lib.api).items() if not k.startswith("__")})
globals().update({name: getattr(_lib, name) for name in _lib.api.FUNCTIONS if name not in _lib.missing})


def set_attribute(handle, attribute, value) -> None:
    """Set a descriptor attribute, packing ``value`` as the C type the header states."""
    _attributes.set_attribute(_lib, handle, attribute, value)


def get_attribute(handle, attribute):
    """A descriptor attribute's value as a Python int, float, pointer int or list."""
    return _attributes.get_attribute(_lib, handle, attribute)


def attribute_size(handle, attribute) -> int:
    """Bytes the library reports for an attribute (GetAttribute with a zero-size buffer)."""
    return _attributes.attribute_size(_lib, handle, attribute)


def __dir__():
    return sorted(globals())
