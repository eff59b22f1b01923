"""The whole C API of cublasLt.h, as generated for the loaded library's version.

Enums, structs, handle types and ``#define`` constants come from the generated module
(``nvblaslt._generated.cublaslt_NN``); functions are bound to the libcublasLt that
nvblaslt found, each with argtypes/restype and a status check raising ``CublasLtError``::

    from nvblaslt import lt
    desc = lt.cublasLtMatmulDesc_t()
    lt.cublasLtMatmulDescCreate(ctypes.byref(desc), lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)

The library is loaded when the first name is looked up here, not on import, so that
``import nvblaslt.lt`` and ``from nvblaslt import *`` work on a machine without cuBLAS.
Functions the loaded library does not export are absent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _attributes
from ._loader import library as _library

if TYPE_CHECKING:
    # What type checkers see: the newest bindings module, whose functions are declared there as this
    # module binds them (at run time the loaded library's major picks the module, and only the
    # functions it exports are bound).
    from ._generated.cublaslt_13 import *  # noqa: F403

    library_path: str
    library_version: int


def set_attribute(handle: Any, attribute: Any, value: Any) -> None:
    """Set a descriptor attribute, packing ``value`` as the C type the header states.

    The descriptor kind is told by the attribute's enum: ``cublasLtMatmulDescAttributes_t`` members
    set a matmul descriptor, ``cublasLtMatrixLayoutAttribute_t`` members a layout, and so on.

    Parameters
    ----------
    handle : int or ctypes object
        The C descriptor (an int, a ``c_void_p`` or the handle type), or ``ctypes.byref`` of an
        algorithm for its config attributes.
    attribute : enum member
        A member of one of the generated attribute enums.
    value : int, float or list
        The value; pointers are ints, array attributes lists.

    Raises
    ------
    NvblasltValueError, NvblasltTypeError
        ``value`` does not fit the attribute's C type.
    CublasLtError
        The library refuses the value.

    Examples
    --------
    >>> import ctypes
    >>> from nvblaslt import lt
    >>> desc = lt.cublasLtMatmulDesc_t()
    >>> lt.cublasLtMatmulDescCreate(ctypes.byref(desc), lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)
    0
    >>> lt.set_attribute(desc, lt.cublasLtMatmulDescAttributes_t.EPILOGUE_AUX_LD, 512)
    >>> lt.get_attribute(desc, lt.cublasLtMatmulDescAttributes_t.EPILOGUE_AUX_LD)
    512
    >>> lt.cublasLtMatmulDescDestroy(desc)
    0
    """
    _attributes.set_attribute(_library(), handle, attribute, value)


def get_attribute(handle: Any, attribute: Any) -> Any:
    """A descriptor attribute's value as a Python int, float, pointer int or list.

    Parameters
    ----------
    handle : int or ctypes object
        As for ``set_attribute``.
    attribute : enum member
        A member of one of the generated attribute enums.

    Returns
    -------
    int, float or list
        The value, unpacked from the C type the header states.

    Raises
    ------
    CublasLtError
        The library does not know the attribute.

    Examples
    --------
    See ``set_attribute``.
    """
    return _attributes.get_attribute(_library(), handle, attribute)


def attribute_size(handle: Any, attribute: Any) -> int:
    """Bytes the library reports for an attribute (GetAttribute with a zero-size buffer).

    Parameters
    ----------
    handle : int or ctypes object
        As for ``set_attribute``.
    attribute : enum member
        A member of one of the generated attribute enums.

    Returns
    -------
    int
        The value's size in bytes.

    Raises
    ------
    CublasLtError
        The library does not know the attribute.

    Examples
    --------
    >>> from nvblaslt import MatrixLayout, lt
    >>> layout = MatrixLayout(lt.CUDA_R_32F, 8, 8, 8)
    >>> lt.attribute_size(layout.handle, lt.cublasLtMatrixLayoutAttribute_t.ROWS)
    8
    """
    return _attributes.attribute_size(_library(), handle, attribute)


def _bound_names() -> dict[str, Any]:
    """Every name of the generated module, and the functions bound to the loaded library."""
    lib = _library()
    names = {k: v for k, v in vars(lib.api).items() if not k.startswith("__")}
    names.update({name: getattr(lib, name) for name in lib.api.FUNCTIONS if name not in lib.missing})
    names.update(library_path=lib.path, library_version=lib.version)
    return names


if not TYPE_CHECKING:  # hidden from type checkers, which see every name declared above: a misspelt one is an error
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # probes by import machinery and tools must not load the library
            raise AttributeError(name)
        names = _bound_names()
        globals().update(names)  # from now on plain module attributes
        if name not in names:
            raise AttributeError(f"module 'nvblaslt.lt' has no attribute {name!r}")
        return names[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_bound_names()})
