"""The small data model the parser fills and the template renders."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EnumMember:
    c_name: str  # CUBLASLT_EPILOGUE_RELU_AUX_BIAS
    name: str  # RELU_AUX_BIAS (common prefix stripped)
    value: int


@dataclass
class Enum:
    name: str  # the typedef name users know: cublasLtEpilogue_t
    header: str
    members: list[EnumMember]
    aliases: list[str] = field(default_factory=list)  # other typedef names of the same enum
    kind: str = "enum"


@dataclass
class Struct:
    name: str
    header: str
    fields: list[tuple[str, str]]  # (field name, ctypes expression)
    kind: str = "struct"


@dataclass
class Alias:
    """A typedef bound to a ctypes type: handles, scalars, callbacks."""

    name: str
    header: str
    ctype: str
    kind: str = "alias"


@dataclass
class Function:
    name: str
    restype: str  # ctypes expression, "None" for void
    returns_status: bool  # returns cublasStatus_t: checked by the loader
    argtypes: list[str]
    param_names: list[str]
    prototype: str  # the C declaration, for docstrings and error messages


@dataclass
class Constant:
    name: str
    value: int


@dataclass
class AttributeType:
    member: str  # C name of the enum member
    ctype: str  # ctypes expression of one element
    is_array: bool  # the value is an array of ctype (capabilities such as TILE_IDS)
    c_spelling: str  # the type as the header states it


@dataclass
class AttributeEnum:
    enum: str
    getter: str | None
    setter: str | None
    types: list[AttributeType]


@dataclass
class Bindings:
    version: tuple[int, int, int, int]  # CUBLAS_VER_MAJOR, MINOR, PATCH, BUILD
    sources: list[str]  # provenance lines for the banner
    declarations: list[Enum | Struct | Alias]  # header order
    functions: list[Function]  # header order
    constants: list[Constant]
    attributes: list[AttributeEnum]
