"""Pythonic owners of cuBLASLt descriptors: Handle, MatmulDesc, MatrixLayout,
MatmulPreference, Algorithm and heuristic results.

Each owns one C object, exposes typed attribute ``get``/``set`` (by enum member or by
name, e.g. ``desc.set("EPILOGUE_AUX_LD", 256)``) and frees it deterministically:
``close()``, ``with``, or when collected (``weakref.finalize``).
"""

from __future__ import annotations

import ctypes
import enum
import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from . import _cuda
from ._attributes import attribute_size, get_attribute, set_attribute, supported
from ._errors import NvblasltError, NvblasltTypeError, NvblasltUnsupportedError, NvblasltValueError, argument_error
from ._grouped_version import API_VERSION, require_grouped
from ._loader import Library, library

# An attribute: its enum member, or the member's name without the prefix ("EPILOGUE_AUX_LD").
Attribute = enum.IntEnum | str


_OwnedT = TypeVar("_OwnedT", bound="_Owned")

# {address: GPU ordinal} of every live Handle nvblaslt made, so that options.handle of another GPU is refused
_devices_of_handles: dict[int, int] = {}


def _destroy(destroy: Callable[[int], Any], handle: int) -> None:
    destroy(handle)


def _destroy_handle(destroy: Callable[[int], Any], handle: int) -> None:
    _devices_of_handles.pop(handle, None)  # before the address can be given to another handle
    destroy(handle)


class _Owned:
    """Owns one C handle; ``_destroy_name`` is the cuBLASLt function that frees it."""

    _destroy_name: str
    _release: Callable[[Callable[[int], Any], int], None] = staticmethod(_destroy)

    def __init__(self, lib: Library, handle: int):
        self.lib = lib
        self._handle = handle
        self._finalizer = weakref.finalize(self, self._release, getattr(lib, self._destroy_name), handle)

    @property
    def handle(self) -> int:
        """The C handle as an int (NvblasltValueError once closed)."""
        if not self._finalizer.alive:
            raise NvblasltValueError(f"{type(self).__name__} was closed")
        return self._handle

    def close(self) -> None:
        """Destroy the C object now (again: nothing); ``with`` closes on exit."""
        self._finalizer()

    def __enter__(self: _OwnedT) -> _OwnedT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _member_of(enum_type: type[enum.IntEnum], attribute: Attribute) -> enum.IntEnum:
    """``attribute`` as a member of ``enum_type``: a member, or its name without the prefix, in any case."""
    if isinstance(attribute, str):
        try:
            return enum_type[attribute.upper()]
        except KeyError:
            raise NvblasltValueError(
                f"attribute: {attribute!r} is not a member of {enum_type.__name__}; "
                f"known: {', '.join(enum_type.__members__)}"
            ) from None
    if not isinstance(attribute, enum_type):
        raise NvblasltTypeError(f"attribute: expected a {enum_type.__name__} member or its name, got {attribute!r}")
    return attribute


class _Descriptor(_Owned):
    """A descriptor with typed attributes from the generated table."""

    _attribute_enum: str

    def _member(self, attribute: Attribute) -> enum.IntEnum:
        return _member_of(getattr(self.lib.api, self._attribute_enum), attribute)

    def set(self, attribute: Attribute, value: Any) -> None:
        """Set an attribute, packing ``value`` as the C type the header states.

        Parameters
        ----------
        attribute : enum member or str
            A member of the descriptor's attribute enum, or its name without the prefix, in any case.
        value : int, float or list
            Pointers are ints, array attributes lists.

        Raises
        ------
        NvblasltValueError, NvblasltTypeError, CublasLtError
            An unknown name, another enum's member, a value the C type cannot hold, or the library refuses.
        """
        set_attribute(self.lib, self.handle, self._member(attribute), value)

    def get(self, attribute: Attribute) -> Any:
        """An attribute's value, unpacked from the C type the header states.

        Parameters
        ----------
        attribute : enum member or str
            A member of the descriptor's attribute enum, or its name without the prefix, in any
            case (as for ``set``).

        Returns
        -------
        int, float, list or None
            The value: an int for integers, enums and pointers (None for a NULL pointer), a float
            for floating point, a list for array attributes.

        Raises
        ------
        NvblasltValueError, NvblasltTypeError, CublasLtError
            An unknown name, another enum's member, an attribute the loaded library does not know,
            or the library refuses; the descriptor was closed (``NvblasltValueError``).

        Examples
        --------
        >>> from nvblaslt import MatmulDesc, lt
        >>> desc = MatmulDesc(lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)
        >>> desc.get("transa"), desc.get(lt.CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) == lt.CUBLAS_COMPUTE_32F
        (0, True)
        """
        return get_attribute(self.lib, self.handle, self._member(attribute))

    def size(self, attribute: Attribute) -> int:
        """The size in bytes of an attribute's value, as the library reports it.

        A zero-size ``…GetAttribute`` query: for an array attribute, it tells how many elements
        ``get`` will return.

        Parameters
        ----------
        attribute : enum member or str
            A member of the descriptor's attribute enum, or its name without the prefix (as for
            ``set``).

        Returns
        -------
        int
            The bytes the value takes.

        Raises
        ------
        NvblasltValueError, NvblasltTypeError, CublasLtError
            As ``get`` raises them.

        Examples
        --------
        >>> from nvblaslt import MatmulDesc, lt
        >>> desc = MatmulDesc(lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)
        >>> desc.size("TRANSA"), desc.size("BIAS_POINTER")
        (4, 8)
        """
        return attribute_size(self.lib, self.handle, self._member(attribute))

    def attributes(self) -> dict[str, object]:
        """Every attribute the loaded library knows, with its current value, by name (a debugging aid).

        The bindings come from the newest cuBLAS headers; attributes an older loaded library does
        not know are left out.

        Returns
        -------
        dict of str to object
            ``{name without prefix: value}``, in the enum's order.

        Raises
        ------
        NvblasltValueError
            The descriptor was closed.
        CublasLtError
            The library refuses a query.

        Examples
        --------
        >>> from nvblaslt import MatmulDesc, lt
        >>> values = MatmulDesc(lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F).attributes()
        >>> values["EPILOGUE"] == lt.CUBLASLT_EPILOGUE_DEFAULT, values["BIAS_POINTER"]
        (True, None)
        """
        enum_type = getattr(self.lib.api, self._attribute_enum)
        return {m.name: self.get(m) for m in supported(self.lib, enum_type)}

    def __repr__(self) -> str:
        state = "closed" if not self._finalizer.alive else f"0x{self._handle:x}"
        return f"<{type(self).__name__} {state}>"


_INT32 = (-(2**31), 2**31 - 1)  # a C enum (data type, compute type, order)
_EXTENT = (0, 2**63 - 1)  # rows, columns, leading dimension: int64_t in the library


def _integer(argument: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in [low, high] (NumPy integers count, bool does not), checked before C sees it."""
    if isinstance(value, bool):
        raise argument_error(NvblasltTypeError, argument, repr(value), "an integer")
    try:
        number = operator.index(value)
    except TypeError:
        raise argument_error(NvblasltTypeError, argument, f"{value!r} ({type(value).__name__})", "an integer") from None
    if not low <= number <= high:
        raise argument_error(NvblasltValueError, argument, number, f"an integer in [{low}, {high}]")
    return number


def _create(create: Callable[..., Any], *args: Any) -> int:
    handle = ctypes.c_void_p()
    create(ctypes.byref(handle), *args)
    return handle.value or 0  # never NULL: a failed create raised CublasLtError


class MatmulDesc(_Descriptor):
    """``cublasLtMatmulDesc_t``: compute type, scale type, transposes, epilogue… (no GPU needed).

    Parameters
    ----------
    compute_type, scale_type : int
        A ``cublasComputeType_t`` (``lt.CUBLAS_COMPUTE_32F``, …); alpha's and beta's ``cudaDataType``.
    lib : Library, optional

    Raises
    ------
    NvblasltTypeError, NvblasltValueError, CublasLtError
        An argument that is not an integer or outside the C enum's range; the library refuses them.

    Examples
    --------
    >>> from nvblaslt import MatmulDesc, lt
    >>> desc = MatmulDesc(lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)
    >>> desc.set("EPILOGUE", lt.CUBLASLT_EPILOGUE_RELU_BIAS); lt.cublasLtEpilogue_t(desc.get("EPILOGUE")).name
    'RELU_BIAS'
    """

    _attribute_enum = "cublasLtMatmulDescAttributes_t"
    _destroy_name = "cublasLtMatmulDescDestroy"

    def __init__(self, compute_type: int, scale_type: int, *, lib: Library | None = None):
        compute_type = _integer("compute_type", compute_type, *_INT32)
        scale_type = _integer("scale_type", scale_type, *_INT32)
        lib = lib or library()
        super().__init__(lib, _create(lib.cublasLtMatmulDescCreate, compute_type, scale_type))


class MatrixLayout(_Descriptor):
    """``cublasLtMatrixLayout_t``: type, rows, cols, leading dimension, order, batch (no GPU needed).

    Parameters
    ----------
    data_type : int
        The elements' ``cudaDataType`` (``lt.CUDA_R_16BF``, …).
    rows, cols, ld : int
        The extent, and the leading dimension in elements.
    order, batch_count, batch_stride : int, optional
        A ``cublasLtOrder_t`` (default: column-major); matrices in the batch (1), elements between them (0).
    lib : Library, optional

    Raises
    ------
    NvblasltTypeError, NvblasltValueError, CublasLtError
        An argument that is not an integer or outside its C type's range; the library refuses them.

    Examples
    --------
    >>> from nvblaslt import MatrixLayout, lt
    >>> layout = MatrixLayout(lt.CUDA_R_16F, 1024, 512, 1024, batch_count=8, batch_stride=2**19)
    >>> layout.get("BATCH_COUNT"), layout.get("STRIDED_BATCH_OFFSET")
    (8, 524288)
    """

    _attribute_enum = "cublasLtMatrixLayoutAttribute_t"
    _destroy_name = "cublasLtMatrixLayoutDestroy"

    def __init__(self, data_type: int, rows: int, cols: int, ld: int, *, order: int | None = None,
                 batch_count: int = 1, batch_stride: int = 0, lib: Library | None = None):
        data_type = _integer("data_type", data_type, *_INT32)
        rows, cols = _integer("rows", rows, *_EXTENT), _integer("cols", cols, *_EXTENT)
        ld = _integer("ld", ld, *_EXTENT)
        order = None if order is None else _integer("order", order, *_INT32)
        batch_count = _integer("batch_count", batch_count, 1, _INT32[1])
        lib = lib or library()
        super().__init__(lib, _create(lib.cublasLtMatrixLayoutCreate, data_type, rows, cols, ld))
        if order is not None:
            self.set("ORDER", order)
        if batch_count != 1:
            self.set("BATCH_COUNT", batch_count)
            self.set("STRIDED_BATCH_OFFSET", batch_stride)


class GroupedMatrixLayout(MatrixLayout):
    """``cublasLtGroupedMatrixLayoutCreate``: a layout whose every group has its own rows, columns
    and leading dimension, read from device arrays when the matmul runs (experimental in cuBLASLt).

    Parameters
    ----------
    data_type : int
        The elements' ``cudaDataType``.
    group_count : int
        The number of groups.
    rows_array, cols_array, ld_array : int
        Device pointers to ``group_count`` integers each (int64 unless ``integer_width`` says 32).
    integer_width : int, optional
        64 (default) or 32: the arrays' element width.
    lib : Library, optional

    Raises
    ------
    NvblasltUnsupportedError
        The library has no grouped layouts (cuBLAS older than 13.2).

    Examples
    --------
    >>> from nvblaslt import GroupedMatrixLayout, library, lt
    >>> if library().version >= 130200:  # pointers are only stored until a matmul runs
    ...     layout = GroupedMatrixLayout(lt.CUDA_R_16BF, 8, 0x7000_0000, 0x7000_0040, 0x7000_0080)
    ...     assert layout.get("BATCH_MODE") == lt.CUBLASLT_BATCH_MODE_GROUPED
    """

    def __init__(self, data_type: int, group_count: int, rows_array: int, cols_array: int, ld_array: int, *,
                 integer_width: int = 64, lib: Library | None = None):
        data_type = _integer("data_type", data_type, *_INT32)
        group_count = _integer("group_count", group_count, 1, _INT32[1])
        pointers = [_integer(name, value, 0, 2**64 - 1) for name, value in
                    (("rows_array", rows_array), ("cols_array", cols_array), ("ld_array", ld_array))]
        if integer_width not in (32, 64):
            raise NvblasltUnsupportedError(f"integer_width: expected 32 or 64, got {integer_width!r}")
        lib = lib or library()
        require_grouped(lib, API_VERSION)  # the function exists from 13.2
        _Descriptor.__init__(self, lib, _create(lib.cublasLtGroupedMatrixLayoutCreate, data_type, group_count,
                                                *pointers))
        width = getattr(lib.api, f"CUBLASLT_INTEGER_WIDTH_{integer_width}")
        self.set("GROUPED_MATRIX_LAYOUT_ROWS_COLS_ARRAY_INTEGER_WIDTH", int(width))
        self.set("GROUPED_MATRIX_LAYOUT_LD_ARRAY_INTEGER_WIDTH", int(width))


class MatmulPreference(_Descriptor):
    """``cublasLtMatmulPreference_t``: what the heuristics may return (workspace, alignment…).

    Parameters
    ----------
    max_workspace_bytes, lib : int, Library (optional)
        The most workspace an algorithm may use (``MAX_WORKSPACE_BYTES``; the library's default: 0).

    Examples
    --------
    >>> from nvblaslt import MatmulPreference
    >>> MatmulPreference(max_workspace_bytes=32 << 20).get("MAX_WORKSPACE_BYTES")
    33554432
    """

    _attribute_enum = "cublasLtMatmulPreferenceAttributes_t"
    _destroy_name = "cublasLtMatmulPreferenceDestroy"

    def __init__(self, *, max_workspace_bytes: int | None = None, lib: Library | None = None):
        lib = lib or library()
        super().__init__(lib, _create(lib.cublasLtMatmulPreferenceCreate))
        if max_workspace_bytes is not None:
            self.set("MAX_WORKSPACE_BYTES", max_workspace_bytes)


class Handle(_Owned):
    """``cublasLtHandle_t`` for one device (needs a GPU). Use ``Handle.for_device()``: one per (thread, device).

    Parameters
    ----------
    device, lib : int, Library (optional)
        The GPU ordinal the handle belongs to (current while it is made); default: ``library()``.

    Raises
    ------
    NvblasltTypeError, NvblasltValueError, CublasLtError
        ``device`` is no ordinal of a GPU this process sees; ``cublasLtCreate`` failed (no usable GPU).

    Examples
    --------
    On a GPU, a handle of the caller's: ``nvblaslt.matmul(a, b, options={"handle": Handle(0).handle})``.
    """

    _destroy_name = "cublasLtDestroy"
    _release = staticmethod(_destroy_handle)
    _per_thread = threading.local()

    def __init__(self, device: int, *, lib: Library | None = None):
        device = _integer("device", device, 0, _INT32[1])
        count = _cuda.device_count()
        if count and device >= count:  # (no GPU at all: cublasLtCreate says so)
            raise argument_error(NvblasltValueError, "device", device, f"a GPU ordinal below {count} (the GPUs "
                                 f"this process sees)")
        lib = lib or library()
        self.device = device
        with _cuda.on_device(device):  # a handle belongs to the device current when it is made
            super().__init__(lib, _create(lib.cublasLtCreate))
        _devices_of_handles[self._handle] = device

    @classmethod
    def for_device(cls, device: int | None = None) -> Handle:
        """This thread's handle for ``device``, created on first use and kept (needs a GPU).

        cuBLASLt handles are best not shared between threads; nvblaslt keeps one per (thread,
        device), and so does this. The handle lives as long as the thread's storage.

        Parameters
        ----------
        device : int, optional
            The GPU ordinal; default the current device.

        Returns
        -------
        Handle
            The same object on every call from this thread for this device.

        Raises
        ------
        NvblasltTypeError, NvblasltValueError
            ``device`` is not an ordinal of a GPU this process sees.
        CublasLtError
            ``cublasLtCreate`` failed (no usable GPU).
        CudaError
            The current device could not be read.

        Examples
        --------
        .. code-block:: python

            handle = Handle.for_device(0)
            assert Handle.for_device(0) is handle                # one per thread and device
            nvblaslt.matmul(a, b, options={"handle": handle.handle})
        """
        if device is None:
            device = _cuda.current_device()
        handles = cls._per_thread.__dict__.setdefault("handles", {})
        handle = handles.get(device)
        if handle is None:
            handle = handles[device] = cls(device)
        return handle


def check_handle_device(handle: int, device: int) -> None:
    """Refuse ``options.handle`` where it is a ``Handle`` nvblaslt made for a GPU other than
    ``device`` (the plan's). A caller's own handle's device cannot be read: it is taken on trust."""
    made_for = _devices_of_handles.get(handle)
    if made_for is not None and made_for != device:
        raise NvblasltValueError(f"options.handle: expected a cublasLtHandle_t for GPU {device} (the operands'), got "
                                 f"0x{handle:x}, nvblaslt's Handle for GPU {made_for}; use Handle.for_device({device})")


class Algorithm:
    """A ``cublasLtMatmulAlgo_t`` (64 bytes, copied by value) with typed config attributes.

    Parameters
    ----------
    algo, lib : lt.cublasLtMatmulAlgo_t, Library, optional
        The C struct (from the heuristics or ``cublasLtMatmulAlgoInit``), kept as ``algo``; ``library()``.

    Examples
    --------
    On a GPU, of a plan's first algorithm: ``mm.algorithms[0].algorithm.set("SPLITK_NUM", 2)``.
    """

    def __init__(self, algo: Any, lib: Library | None = None):
        self.lib = lib or library()
        self.algo = algo
        self.workspace_size: int | None = None  # known where the heuristics or a check returned it

    def _member(self, attribute: Attribute, enum_name: str) -> enum.IntEnum:
        # a name it lacks or another enum's member is refused as the descriptors refuse them (the member
        # picks the C getter: another enum's would read the 64-byte struct as that descriptor)
        return _member_of(getattr(self.lib.api, enum_name), attribute)

    def get(self, attribute: Attribute) -> Any:
        """A config attribute of this algorithm (``ID``, ``TILE_ID``, ``SPLITK_NUM``, …).

        Parameters
        ----------
        attribute : enum member or str
            A ``cublasLtMatmulAlgoConfigAttributes_t`` member, or its name without the
            ``CUBLASLT_ALGO_CONFIG_`` prefix, in any case.

        Returns
        -------
        int
            The value (tile and stages ids are ``cublasLtMatmulTile_t`` / ``cublasLtMatmulStages_t``
            values; the ``tile`` and ``stages`` properties name them).

        Raises
        ------
        NvblasltValueError
            ``attribute`` is a name that is not a member (the message lists the known ones), or a
            member the loaded library does not know.
        NvblasltTypeError
            ``attribute`` is a member of another enum, or neither a member nor a name.
        CublasLtError
            The library refuses.

        Examples
        --------
        >>> from nvblaslt import Algorithm, lt
        >>> algorithm = Algorithm(lt.cublasLtMatmulAlgo_t())   # zeroed; on a GPU, from the heuristics
        >>> algorithm.get("ID"), algorithm.get(lt.CUBLASLT_ALGO_CONFIG_SPLITK_NUM)
        (0, 0)
        """
        member = self._member(attribute, "cublasLtMatmulAlgoConfigAttributes_t")
        return get_attribute(self.lib, ctypes.byref(self.algo), member)

    def set(self, attribute: Attribute, value: Any) -> None:
        """Set a config attribute of this algorithm, in place.

        For an algorithm from ``cublasLtMatmulAlgoInit`` or the heuristics: a plan checks it again
        (``cublasLtMatmulAlgoCheck``) when it is given as ``plan(algorithms=[…])``.

        Parameters
        ----------
        attribute : enum member or str
            A ``cublasLtMatmulAlgoConfigAttributes_t`` member, or its name without the prefix.
        value : int
            The value, packed as the C type the header states.

        Raises
        ------
        NvblasltValueError
            ``attribute`` is a name that is not a member (the message lists the known ones), an
            attribute the loaded library does not know, or a value the C type cannot hold.
        NvblasltTypeError
            ``attribute`` is a member of another enum, or neither a member nor a name; a value of
            a type the C type cannot hold.
        CublasLtError
            The library refuses.

        Examples
        --------
        >>> from nvblaslt import Algorithm, lt
        >>> algorithm = Algorithm(lt.cublasLtMatmulAlgo_t())
        >>> algorithm.set("SPLITK_NUM", 4)
        >>> algorithm.get("SPLITK_NUM")
        4
        """
        member = self._member(attribute, "cublasLtMatmulAlgoConfigAttributes_t")
        set_attribute(self.lib, ctypes.byref(self.algo), member, value)

    def capability(self, attribute: Attribute) -> Any:
        """A capability of this algorithm's id (``TILE_IDS``, ``STAGES_IDS``, ``EPILOGUE_MASK``, …).

        cuBLASLt answers only for an algorithm ``cublasLtMatmulAlgoInit`` made or the heuristics
        returned, which needs a GPU.

        Parameters
        ----------
        attribute : enum member or str
            A ``cublasLtMatmulAlgoCapAttributes_t`` member, or its name without the
            ``CUBLASLT_ALGO_CAP_`` prefix, in any case.

        Returns
        -------
        int or list of int
            The value; array capabilities (``TILE_IDS``, ``STAGES_IDS``) as lists.

        Raises
        ------
        NvblasltValueError
            ``attribute`` is a name that is not a member (the message lists the known ones), or a
            member the loaded library does not know.
        NvblasltTypeError
            ``attribute`` is a member of another enum, or neither a member nor a name.
        CublasLtError
            The library refuses (an algorithm it did not make).

        Examples
        --------
        .. code-block:: python

            algorithm = mm.algorithms[0].algorithm             # a plan's first algorithm
            algorithm.capability("TILE_IDS")                   # the tiles this id supports
            algorithm.capability("EPILOGUE_MASK") & lt.CUBLASLT_EPILOGUE_RELU_BIAS
        """
        member = self._member(attribute, "cublasLtMatmulAlgoCapAttributes_t")
        return get_attribute(self.lib, ctypes.byref(self.algo), member)

    @property
    def id(self) -> int:
        """The algorithm id (config attribute ``ID``)."""
        return self.get("ID")

    @property
    def tile(self) -> str:
        """The tile's name without its prefix (``"128x128"``)."""
        return self.lib.api.cublasLtMatmulTile_t(self.get("TILE_ID")).name.removeprefix("TILE_")

    @property
    def stages(self) -> str:
        """The stages' name without its prefix (``"64x3"``)."""
        return self.lib.api.cublasLtMatmulStages_t(self.get("STAGES_ID")).name.removeprefix("STAGES_")

    def config(self) -> dict[str, object]:
        """Every config attribute the loaded library knows, with its value, by name.

        Returns
        -------
        dict of str to int
            ``{name without prefix: value}``, in the enum's order.

        Examples
        --------
        >>> from nvblaslt import Algorithm, lt
        >>> config = Algorithm(lt.cublasLtMatmulAlgo_t()).config()
        >>> config["ID"], config["SPLITK_NUM"]
        (0, 0)
        """
        enum_type = self.lib.api.cublasLtMatmulAlgoConfigAttributes_t
        return {m.name: self.get(m) for m in supported(self.lib, enum_type)}

    def __repr__(self) -> str:
        return f"<Algorithm id={self.id} tile={self.tile} stages={self.stages}>"


def _config_property(attribute: str, convert=int):
    def get(self):
        return convert(self.algorithm.get(attribute))

    def set(self, value) -> None:
        self.algorithm.set(attribute, int(value))
    return property(get, set, doc=f"The algorithm's {attribute} config attribute (nvmath-python's name).")


def _cluster_shape_property():
    """CLUSTER_SHAPE_ID as nvmath-python has it: an (x, y, z) tuple (the id where it names no shape)."""
    def members(self):
        return self.algorithm.lib.api.cublasLtClusterShape_t

    def get(self):
        value = int(self.algorithm.get("CLUSTER_SHAPE_ID"))
        try:
            name = members(self)(value).name
            return tuple(int(x) for x in name.removeprefix("SHAPE_").split("x"))
        except ValueError:  # AUTO, or an id this release does not name
            return value

    def set(self, value) -> None:
        if isinstance(value, (tuple, list)):
            name = "SHAPE_" + "x".join(str(x) for x in value)
            if not all(type(x) is int for x in value) or name not in members(self).__members__:
                raise NvblasltValueError(f"cluster_shape: expected one of the loaded cuBLASLt's cluster shapes, got "
                                         f"{tuple(value)}")
            value = members(self)[name]
        self.algorithm.set("CLUSTER_SHAPE_ID", int(value))
    return property(get, set, doc="The algorithm's cluster shape, as an (x, y, z) tuple (nvmath-python's name).")


class HeuristicResult:
    """One algorithm the heuristics proposed, with its workspace and estimated waves.

    ``Matmul.plan()`` returns them best first. Config attributes are also settable properties under
    nvmath-python's names (``tile``, ``stages``, ``split_k``, ``cta_swizzling``, …).

    Parameters
    ----------
    result, lib : lt.cublasLtMatmulHeuristicResult_t, Library
        The C struct, read into ``algorithm`` (an ``Algorithm``), ``workspace_size`` and ``waves``.

    Examples
    --------
    On a GPU, a plan's first algorithm again later: ``mm.plan(algorithms=[found[0].as_bytes()])``.
    """

    def __init__(self, result: Any, lib: Library):
        self.algorithm = Algorithm(result.algo, lib)
        self.workspace_size = int(result.workspaceSize)
        self.waves = float(result.wavesCount)
        self.algorithm.workspace_size = self.workspace_size  # nvmath-python's ``algorithm.workspace_size``

    def __reduce__(self):  # pickled as its bytes: the library handle it holds is process-local
        return _heuristic_result, (self.as_bytes(), self.workspace_size, self.waves)

    @property
    def algo_id(self) -> int:
        """The algorithm id (also ``algorithm_id``, nvmath-python's name)."""
        return self.algorithm.id

    # nvmath-python's Algorithm surface: each config attribute as a property, settable
    algorithm_id = property(lambda self: self.algorithm.id)
    tile = _config_property("TILE_ID")
    stages = _config_property("STAGES_ID")
    split_k = _config_property("SPLITK_NUM")
    reduction_scheme = _config_property("REDUCTION_SCHEME")
    cta_swizzling = _config_property("CTA_SWIZZLING", bool)
    custom_option = _config_property("CUSTOM_OPTION")
    inner_shape = _config_property("INNER_SHAPE_ID")
    cluster_shape = _cluster_shape_property()

    @property
    def capabilities(self) -> Capabilities:
        """Every capability attribute of this algorithm id the loaded library knows and answers, by name."""
        enum_type = self.algorithm.lib.api.cublasLtMatmulAlgoCapAttributes_t
        found = Capabilities()
        for member in enum_type:
            try:
                found[member.name] = self.algorithm.capability(member)
            except NvblasltError:  # not known to this release, or needs a GPU to answer
                continue
        return found

    def as_bytes(self) -> bytes:
        """The algorithm's 64 bytes (its ``cublasLtMatmulAlgo_t``), to store and give back later.

        ``Matmul.plan(algorithms=[…])``, ``Matmul.execute(algorithm=…)`` and
        ``matmul(algorithm=…)`` take them back, on any process with the same cuBLASLt and GPU
        (cuBLASLt checks them again for the problem). Pickling a ``HeuristicResult`` stores these
        bytes too.

        Returns
        -------
        bytes
            64 bytes.

        Examples
        --------
        >>> import nvblaslt
        >>> from nvblaslt import HeuristicResult, lt
        >>> result = HeuristicResult(lt.cublasLtMatmulHeuristicResult_t(), nvblaslt.library())
        >>> len(result.as_bytes())                              # on a GPU: mm.algorithms[0].as_bytes()
        64
        """
        return bytes(memoryview(self.algorithm.algo))

    def __repr__(self) -> str:
        a = self.algorithm
        return (f"<HeuristicResult id={a.id} tile={a.tile} stages={a.stages} "
                f"workspace={self.workspace_size} waves={self.waves:.2f}>")


class Capabilities(dict):
    """An algorithm's capabilities by name (``caps["TILE_IDS"]``), also as attributes under
    nvmath-python's lower-case names (``caps.tile_ids``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name.upper()]
        except KeyError:
            raise AttributeError(name) from None


def _heuristic_result(data: bytes, workspace_size: int, waves: float) -> HeuristicResult:
    """A pickled ``HeuristicResult`` back, on this process's library."""
    lib = library()
    result = lib.api.cublasLtMatmulHeuristicResult_t()
    result.algo = lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(data)
    result.workspaceSize, result.wavesCount = workspace_size, waves
    return HeuristicResult(result, lib)


def heuristics(handle: Handle, desc: MatmulDesc, a: MatrixLayout, b: MatrixLayout, c: MatrixLayout,
               d: MatrixLayout, preference: MatmulPreference, count: int = 8) -> list[HeuristicResult]:
    """``cublasLtMatmulAlgoGetHeuristic``: up to ``count`` algorithms, best first.

    Parameters
    ----------
    handle, desc : Handle, MatmulDesc
        The device's handle; the operation (compute and scale types, transposes, epilogue).
    a, b, c, d : MatrixLayout
        The layouts of A, B, C and D.
    preference, count : MatmulPreference, int (default 8)
        What the algorithms may need (workspace, alignment); the most algorithms to return.

    Returns
    -------
    list of HeuristicResult

    Raises
    ------
    CublasLtError
        The library refuses the problem (``CUBLAS_STATUS_NOT_SUPPORTED``: no kernel fits).

    Examples
    --------
    On a GPU: ``heuristics(Handle.for_device(0), desc, a, b, d, d, MatmulPreference(max_workspace_bytes=2**25))``.
    """
    lib = handle.lib
    results = (lib.api.cublasLtMatmulHeuristicResult_t * count)()
    returned = ctypes.c_int()
    lib.cublasLtMatmulAlgoGetHeuristic(handle.handle, desc.handle, a.handle, b.handle, c.handle, d.handle,
                                       preference.handle, count, results, ctypes.byref(returned))
    return [HeuristicResult(results[i], lib) for i in range(returned.value)]
