"""Find libcublasLt, load it, and bind the generated module that matches its version."""

from __future__ import annotations

import ctypes
import importlib
import os
import pkgutil
import threading
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ._errors import CublasLtError, LibraryNotFoundError, NvblasltStateError, NvblasltTypeError

ENV_LIBRARY = "NVBLASLT_LIBRARY"

# What to install when no libcublasLt is found: NVIDIA's wheels, by CUDA major.
INSTALL_HINT = "`pip install nvidia-cublas` (CUDA 13) or `pip install nvidia-cublas-cu12` (CUDA 12)"

# The generator is not part of the installed package: it runs from a source checkout.
CODEGEN_HINT = ("from a source checkout of nvblaslt (`pip install -e \".[codegen]\"`), "
                "`python -m codegen --header <its include dir> --out nvblaslt/_generated/cublaslt_{major}.py`")


def available_modules() -> dict[int, str]:
    """{cuBLAS major version: generated module name} for the committed bindings."""
    from . import _generated

    found = {}
    for info in pkgutil.iter_modules(_generated.__path__):
        if info.name.startswith("cublaslt_"):
            found[int(info.name.split("_")[1])] = f"{_generated.__name__}.{info.name}"
    return found


@dataclass(eq=False)  # one object per loaded library: hashable by identity, so results can be cached on it
class Library:
    """One loaded libcublasLt with its bindings: ``lib.cublasLtMatmul(...)``, ``lib.api.<enum>``.

    Every function of the generated module that the library exports is an attribute, with its
    argtypes, restype and a status check raising ``CublasLtError``; a function the headers declare but
    this library does not export raises ``AttributeError`` naming both versions. Made by ``load()``;
    ``library()`` gives the process-wide one.

    Parameters
    ----------
    path : str
        The file loaded.
    found_via : str
        How it was found: ``"$NVBLASLT_LIBRARY"``, ``"cuda-pathfinder (…)"``, ``"explicit path"`` or
        ``"nvblaslt.load(process_wide=True)"``.
    version : int
        ``cublasLtGetVersion()``: 130100 for 13.1.0.
    api : module
        The generated bindings module for this major version (``nvblaslt._generated.cublaslt_13``).
    cdll : ctypes.CDLL
        The loaded library.
    missing : list of str
        Functions the headers declare that this library does not export.

    Examples
    --------
    >>> import nvblaslt
    >>> lib = nvblaslt.library()
    >>> lib.version_tuple[0] == lib.bindings_version[0]
    True
    >>> lib.status_name(0)
    'CUBLAS_STATUS_SUCCESS'
    """

    path: str
    found_via: str
    version: int  # cublasLtGetVersion(): 130100 for 13.1.0
    api: ModuleType  # the generated module for this major version
    cdll: ctypes.CDLL = field(repr=False)
    missing: list[str] = field(default_factory=list)  # declared in the header, not exported

    @property
    def version_tuple(self) -> tuple[int, int, int]:
        """The library's version as (major, minor, patch): (13, 1, 0) for 130100."""
        return self.version // 10000, self.version // 100 % 100, self.version % 100

    @property
    def bindings_version(self) -> tuple[int, ...]:
        """The cuBLAS release whose headers ``api`` was generated from: (13, 10, 0, 20)."""
        return tuple(self.api.CUBLAS_VERSION)

    def __getattr__(self, name: str) -> Any:
        if name in self.missing:
            raise AttributeError(
                f"{name} is declared by the cuBLAS {'.'.join(map(str, self.api.CUBLAS_VERSION))} headers "
                f"but not exported by {self.path} (cuBLASLt {'.'.join(map(str, self.version_tuple))})"
            )
        raise AttributeError(name)

    def status_name(self, status: int) -> str:
        """The name of a ``cublasStatus_t`` value, from the library.

        Parameters
        ----------
        status : int
            A status a cuBLASLt function returned.

        Returns
        -------
        str
            ``"CUBLAS_STATUS_NOT_SUPPORTED"`` for 15.
        """
        return self.cublasLtGetStatusName(status).decode()

    def status_string(self, status: int) -> str:
        """The library's own description of a ``cublasStatus_t`` value.

        Parameters
        ----------
        status : int
            A status a cuBLASLt function returned.

        Returns
        -------
        str
            What ``CublasLtError`` shows as the library's message.
        """
        return self.cublasLtGetStatusString(status).decode()


def _status_checker(library: Library, name: str):
    def check(status, func, args):
        if status:
            raise CublasLtError(name, status, library.status_name(status), library.status_string(status))
        return status
    return check


def _find() -> tuple[str, str]:
    """(path, how it was found)."""
    override = os.environ.get(ENV_LIBRARY)
    if override:
        return override, f"${ENV_LIBRARY}"
    try:
        import cuda.pathfinder
    except ImportError as exc:
        raise LibraryNotFoundError(
            f"libcublasLt: cuda-pathfinder is not installed ({exc}); "
            f"`pip install cuda-pathfinder`, or set {ENV_LIBRARY}=/path/to/libcublasLt.so"
        ) from exc
    try:
        loaded = cuda.pathfinder.load_nvidia_dynamic_lib("cublasLt")
    except Exception as exc:  # pathfinder's own error says what it searched
        raise LibraryNotFoundError(
            "libcublasLt was not found. Searched: "
            f"${ENV_LIBRARY} (unset), then cuda-pathfinder (NVIDIA wheels in site-packages, conda, "
            f"the system loader, CUDA_HOME/CUDA_PATH), which said: {str(exc).strip()}. "
            f"Fix: {INSTALL_HINT}, or point {ENV_LIBRARY} at a libcublasLt.so"
        ) from exc
    return loaded.abs_path, f"cuda-pathfinder ({loaded.found_via})"


def load(path: str | None = None, *, process_wide: bool = False) -> Library:
    """Load a libcublasLt (``path``, or found as ``library()`` finds it) and bind it.

    Each call loads and binds anew; ``library()`` keeps one for the process, and is what the rest of
    nvblaslt uses: ``process_wide=True`` makes the library loaded here that one, without an
    environment variable (a newer cuBLASLt beside the one a framework such as PyTorch pins). A
    library newer than the committed bindings loads with a ``UserWarning``: what it added since is
    not bound.

    Parameters
    ----------
    path : str, optional
        The libcublasLt file. Default: ``$NVBLASLT_LIBRARY`` if set, else what cuda-pathfinder finds
        (NVIDIA's wheels, conda, the system loader, ``CUDA_HOME``).
    process_wide : bool, default False
        Make it the library every nvblaslt call uses (``library()``). Call it before nvblaslt first
        uses a library, and after importing the framework whose own cuBLAS you keep (its libraries
        then stay its own; loaded before them, this one would serve them too). Loading the same file
        again returns the library in use.

    Returns
    -------
    Library
        The library with every function it exports bound.

    Raises
    ------
    LibraryNotFoundError
        No libcublasLt was found or it could not be loaded (the message says where it looked and what
        to install), or nvblaslt has no bindings for its major version.
    NvblasltStateError
        ``process_wide=True`` after nvblaslt already uses another library (its plans, handles and
        descriptors belong to that one).

    Examples
    --------
    >>> import nvblaslt
    >>> lib = nvblaslt.load(nvblaslt.library().path)
    >>> lib.path == nvblaslt.library().path, lib is nvblaslt.library()
    (True, False)
    >>> nvblaslt.load("/nonexistent/libcublasLt.so.13")
    Traceback (most recent call last):
        ...
    nvblaslt.LibraryNotFoundError: libcublasLt at /nonexistent/libcublasLt.so.13 (from explicit path) could not be loaded: ...
    """
    if not isinstance(process_wide, bool):
        raise NvblasltTypeError(f"process_wide: expected a bool, got {process_wide!r}")
    if process_wide:
        with _lock:
            return _make_process_wide(path)
    found_via = "explicit path"
    if path is None:
        path, found_via = _find()
    try:
        cdll = ctypes.CDLL(path)
    except OSError as exc:
        raise LibraryNotFoundError(f"libcublasLt at {path} (from {found_via}) could not be loaded: {exc}") from exc
    get_version = cdll.cublasLtGetVersion
    get_version.restype, get_version.argtypes = ctypes.c_size_t, []
    version = get_version()
    modules = available_modules()
    major = version // 10000
    if major not in modules:
        raise LibraryNotFoundError(
            f"{path} (from {found_via}) is cuBLASLt {version}, major {major}, but nvblaslt has bindings "
            f"only for majors {sorted(modules)}. Either install a supported cuBLAS ({INSTALL_HINT}), "
            f"or generate bindings for it {CODEGEN_HINT.format(major=major)}"
        )
    api = importlib.import_module(modules[major])
    library = Library(path, found_via, version, api, cdll)
    _warn_if_newer_than_bindings(library)
    for name, (restype, returns_status, argtypes, _params, prototype) in api.FUNCTIONS.items():
        try:
            func = getattr(cdll, name)
        except AttributeError:
            library.missing.append(name)
            continue
        func.restype, func.argtypes = restype, argtypes
        if returns_status:
            func.errcheck = _status_checker(library, name)
        func.__doc__ = prototype
        object.__setattr__(library, name, func)
    return library


_warned: set[tuple[str, int]] = set()


def _warn_if_newer_than_bindings(library: Library) -> None:
    """Once per library: what it added since the newest committed module is not bound."""
    if library.version_tuple <= library.bindings_version[:3] or (library.path, library.version) in _warned:
        return
    _warned.add((library.path, library.version))
    major = library.version_tuple[0]
    warnings.warn(
        f"{library.path} is cuBLASLt {'.'.join(map(str, library.version_tuple))}, newer than nvblaslt's newest "
        f"bindings ({library.api.__name__}, from cuBLAS {'.'.join(map(str, library.bindings_version))} headers): "
        f"what it added since is not bound. To bind it, generate bindings {CODEGEN_HINT.format(major=major)}",
        UserWarning, stacklevel=3)


_lock = threading.Lock()
_in_use: Library | None = None  # library()'s, once loaded or chosen


def _make_process_wide(path: str | None) -> Library:
    global _in_use
    if _in_use is not None:
        wanted = os.path.realpath(path) if path is not None else None
        if wanted is None or wanted == os.path.realpath(_in_use.path):
            return _in_use
        raise NvblasltStateError(f"process_wide: nvblaslt already uses {_in_use.path} (cuBLASLt "
                                 f"{'.'.join(map(str, _in_use.version_tuple))}, from {_in_use.found_via}); call "
                                 f"nvblaslt.load({path!r}, process_wide=True) before the first call that needs a "
                                 f"library, or set {ENV_LIBRARY} for the next process")
    _in_use = load(path)
    if path is not None:
        _in_use.found_via = "nvblaslt.load(process_wide=True)"
    return _in_use


def _default() -> Library:
    global _in_use
    if _in_use is None:
        _in_use = load()
    return _in_use


def library() -> Library:
    """The process-wide libcublasLt, loaded on first use.

    Found as ``load()`` finds it (``$NVBLASLT_LIBRARY``, then cuda-pathfinder). ``nvblaslt info`` prints
    what was found and how.

    Returns
    -------
    Library
        The same object on every call.

    Raises
    ------
    LibraryNotFoundError
        As ``load()`` raises it, on every call until a library can be found.

    Examples
    --------
    >>> import nvblaslt
    >>> nvblaslt.library() is nvblaslt.library()
    True
    >>> hasattr(nvblaslt.library(), "cublasLtMatmul")
    True
    """
    with _lock:
        return _default()
