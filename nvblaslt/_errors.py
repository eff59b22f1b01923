"""The exceptions nvblaslt raises. Every one derives from NvblasltError."""

from __future__ import annotations

# Why a status most often comes back, and what to do; shown after the library's own text.
_STATUS_HINTS = {
    "CUBLAS_STATUS_NOT_INITIALIZED": "no usable CUDA GPU or driver was found by cuBLASLt",
    "CUBLAS_STATUS_NOT_SUPPORTED": "this combination of types, layouts, epilog and GPU has no kernel",
    "CUBLAS_STATUS_INVALID_VALUE": "an argument or attribute value (or its size) is out of range",
    "CUBLAS_STATUS_ARCH_MISMATCH": "the GPU's architecture lacks a feature this call needs",
}

LOG_HINT = "For the library's own log set CUBLASLT_LOG_LEVEL=5 (or call nvblaslt.set_log_level(5))"


class NvblasltError(Exception):
    """Base class of every error nvblaslt raises.

    Bad arguments raise subclasses that are also the standard ``ValueError`` / ``TypeError``, naming
    the argument, what was given and what was expected, before any GPU work.

    Examples
    --------
    >>> import nvblaslt
    >>> try:
    ...     nvblaslt.MatmulOptions(blocking=False)
    ... except nvblaslt.NvblasltError as error:
    ...     print(type(error).__name__, isinstance(error, ValueError))
    NvblasltValueError True
    """


class NvblasltValueError(NvblasltError, ValueError):
    """An argument has the right type but a value nvblaslt cannot use."""


class NvblasltTypeError(NvblasltError, TypeError):
    """An argument is of a type nvblaslt cannot use."""


class NvblasltArgumentError(NvblasltTypeError, NvblasltValueError):
    """An argument of a kind the call cannot take (a dtype, a memory space, a package) where
    nvmath-python raises ``ValueError``: both a ``TypeError`` and a ``ValueError``, so that either
    ``except`` catches it."""


class NvblasltStateError(NvblasltValueError, RuntimeError):
    """A call the object's state does not allow now (executing after ``release_operands()``, or
    before ``plan()``): a ``RuntimeError`` as in nvmath-python, and a ``ValueError`` as in earlier
    nvblaslt releases."""


class NvblasltAlgorithmError(NvblasltTypeError, AssertionError):
    """``plan(algorithms=…)`` given something that is not an algorithm. nvmath-python refuses that
    with an ``AssertionError``; this is also one, so code written for either catches it."""


class LibraryNotFoundError(NvblasltError, OSError):
    """libcublasLt could not be found or has no bindings module."""


class CudaError(NvblasltError, RuntimeError):
    """A CUDA runtime call (through cuda-bindings) failed."""


class CublasLtError(NvblasltError, RuntimeError):
    """A cuBLASLt call returned a status other than CUBLAS_STATUS_SUCCESS.

    The message names the function, the status and the library's own description, adds why such a
    status usually comes back, and says how to see the library's log.

    Parameters
    ----------
    function : str
        The C function (kept as ``function``).
    status : int
        The numeric ``cublasStatus_t`` (kept as ``status``).
    status_name : str
        Its name, ``CUBLAS_STATUS_…`` (kept as ``status_name``).
    library_message : str
        The library's own description (kept as ``library_message``).
    hint : str, optional
        What to do, in place of the usual reason for the status.

    Examples
    --------
    >>> from nvblaslt import CublasLtError, lt
    >>> try:
    ...     lt.cublasLtMatmulDescCreate(None, lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)
    ... except CublasLtError as error:
    ...     print(error.function, error.status_name, error.status)
    cublasLtMatmulDescCreate CUBLAS_STATUS_INVALID_VALUE 7
    """

    def __init__(self, function: str, status: int, status_name: str, library_message: str, hint: str = ""):
        self.function = function
        self.status = status
        self.status_name = status_name
        self.library_message = library_message
        text = f"{function} returned {status_name} ({status}): {library_message}"
        if hint:
            text += f"; {hint}"
        elif status_name in _STATUS_HINTS:
            text += f"; usually {_STATUS_HINTS[status_name]}"
        super().__init__(f"{text}. {LOG_HINT}")


class NvblasltUnsupportedError(CublasLtError, NvblasltValueError):
    """A call cuBLASLt answers ``CUBLAS_STATUS_NOT_SUPPORTED`` for (measured), refused before it is
    made, with what to do instead. A ``CublasLtError`` with that status, as nvmath-python's users see
    for the same call (it passes the call on), and a ``ValueError`` naming the argument.

    Parameters
    ----------
    message : str
        The argument, what was given and what would run.

    Examples
    --------
    >>> from nvblaslt import CublasLtError, NvblasltUnsupportedError
    >>> error = NvblasltUnsupportedError("c: RELU_BIAS needs a column-major result")
    >>> isinstance(error, CublasLtError) and isinstance(error, ValueError), error.status_name
    (True, 'CUBLAS_STATUS_NOT_SUPPORTED')
    """

    def __init__(self, message: str):
        self.function, self.status, self.status_name = "(refused before the call)", 15, "CUBLAS_STATUS_NOT_SUPPORTED"
        self.library_message = "the requested functionality is not supported"
        Exception.__init__(self, f"{message} (cuBLASLt answers {self.status_name} for it: "
                                 f"{self.library_message})")


def argument_error(cls: type[NvblasltError], argument: str, given: object, expected: str) -> NvblasltError:
    """An error naming the argument, what was given and what was expected."""
    return cls(f"{argument}: expected {expected}, got {given}")
