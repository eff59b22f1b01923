"""Parse the cuBLASLt headers into the model: preprocess, pycparser, walk the AST.

Facts the AST does not carry are read from the raw header text: ``#define`` constants
(the preprocessor consumed them) and descriptor attribute value types (stated in the
members' doc comments). The comments themselves are never copied.
"""

from __future__ import annotations

import keyword
import os
import re
import subprocess
from pathlib import Path

from pycparser import c_ast, c_generator, c_parser

from . import recipe
from .attribute_types import read_attribute_types
from .constexpr import ConstExprError, evaluate
from .model import Alias, AttributeEnum, Bindings, Constant, Enum, EnumMember, Function, Struct
from .sources import STUBS_DIR, HeaderSet, read_version


class ParseError(RuntimeError):
    pass


def preprocess(directory: Path, header: str = "cublasLt.h") -> str:
    """Run the C preprocessor with our stubs first and no system headers."""
    cpp = os.environ.get("NVBLASLT_CPP", "cpp").split()
    cmd = [*cpp, "-nostdinc", "-I", str(STUBS_DIR), "-I", str(directory), str(directory / header)]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise ParseError(f"no C preprocessor {cpp[0]!r}: install gcc or set NVBLASLT_CPP") from exc
    if result.returncode != 0:
        raise ParseError(f"{' '.join(cmd)} failed:\n{result.stderr}")
    return result.stdout


def _header_of(node: c_ast.Node) -> str:
    return Path(node.coord.file).name if node.coord and node.coord.file else ""


def _is_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def strip_common_prefix(c_names: list[str], known_prefix: str | None = None) -> list[str]:
    """RELU_AUX_BIAS from CUBLASLT_EPILOGUE_RELU_AUX_BIAS: drop the longest shared
    ``PREFIX_`` that leaves every member a valid identifier (COMPUTE_16F, not 16F).
    Members starting with ``known_prefix`` lose that prefix instead."""
    if len(c_names) < 2:
        shared_cut = [n.split("_", 1)[-1] if "_" in n else n for n in c_names]
    else:
        words = [n.split("_") for n in c_names]
        shared = 0
        while all(len(w) > shared + 1 for w in words) and len({w[shared] for w in words}) == 1:
            shared += 1
        shared_cut = c_names
        for cut in range(shared, -1, -1):
            names = ["_".join(w[cut:]) for w in words]
            if all(_is_name(n) for n in names):
                shared_cut = names
                break
    if known_prefix is None:
        return shared_cut
    return [c[len(known_prefix):] if c.startswith(known_prefix) and _is_name(c[len(known_prefix):]) else s
            for c, s in zip(c_names, shared_cut)]


class _Walker:
    def __init__(self, headers: HeaderSet):
        self.headers = headers
        self.declarations: list = []
        self.functions: list[Function] = []
        self.enum_values: dict[str, int] = {}  # every enum constant in the translation unit
        self.enum_by_tag: dict[str, Enum] = {}
        self.enums: dict[str, Enum] = {}  # typedef names (and aliases) -> Enum
        self.structs: dict[str, Struct] = {}
        self.typedefs: dict[str, tuple[c_ast.Node, str]] = {}  # name -> (type node, header)
        self.emitted_aliases: dict[str, Alias] = {}
        self.external: dict[str, Alias] = {}  # typedefs of other headers the API names
        self.generator = c_generator.CGenerator()

    def declared(self, name: str) -> Enum | Alias | None:
        """The enum or bound alias a typedef name of the headers stands for, if any."""
        if name in self.enums:
            return self.enums[name]
        return self.emitted_aliases.get(name)

    # --- types -------------------------------------------------------------------------
    def _is_opaque(self, node: c_ast.Node) -> bool:
        """A struct we do not lay out: forward-declared, or behind a handle typedef."""
        if isinstance(node, c_ast.TypeDecl):
            inner = node.type
            if isinstance(inner, c_ast.Struct):
                return inner.decls is None and inner.name not in self.structs
            if isinstance(inner, c_ast.IdentifierType) and len(inner.names) == 1:
                name = inner.names[0]
                if name in self.structs:
                    return False
                if name in self.typedefs:
                    return self._is_opaque(self.typedefs[name][0])
        return False

    def ctype(self, node: c_ast.Node, in_params: bool = False) -> str:
        if isinstance(node, c_ast.TypeDecl):
            inner = node.type
            if isinstance(inner, c_ast.Enum):
                return "ctypes.c_int"
            if isinstance(inner, c_ast.Struct):
                if inner.name in self.structs:
                    return inner.name
                raise ParseError(f"struct {inner.name} is used by value but never defined")
            return self._named(inner.names)
        if isinstance(node, c_ast.PtrDecl):
            target = node.type
            if isinstance(target, c_ast.FuncDecl):
                return self._callback(target)
            if isinstance(target, c_ast.TypeDecl) and isinstance(target.type, c_ast.IdentifierType):
                if target.type.names == ["char"]:
                    return "ctypes.c_char_p"
                if target.type.names == ["void"]:
                    return "ctypes.c_void_p"
            if self._is_opaque(target):
                return "ctypes.c_void_p"
            return f"ctypes.POINTER({self.ctype(target)})"
        if isinstance(node, c_ast.ArrayDecl):
            element = self.ctype(node.type)
            if in_params or node.dim is None:
                return f"ctypes.POINTER({element})"
            return f"({element} * {evaluate(node.dim, self.enum_values)})"
        raise ParseError(f"unsupported type node {type(node).__name__}")

    def _named(self, names: list[str]) -> str:
        key = tuple(n for n in names if n != "signed" or len(names) == 1)
        if len(names) == 1 and names[0] in recipe.LIBC_TYPEDEFS:
            return recipe.LIBC_TYPEDEFS[names[0]]
        if len(names) == 1 and names[0] in self.enums:
            return "ctypes.c_int"
        if len(names) == 1 and (names[0] in self.structs or names[0] in self.emitted_aliases):
            return names[0]
        if len(names) == 1 and names[0] in self.typedefs:
            name = names[0]
            if name not in self.external:
                node, header = self.typedefs[name]
                self.external[name] = Alias(name, header, self.ctype(node))
            return name
        if key in recipe.C_SCALARS:
            return recipe.C_SCALARS[key]
        raise ParseError(f"unknown type {' '.join(names)}")

    def _callback(self, func: c_ast.FuncDecl) -> str:
        restype = self.ctype(func.type)
        args = [self.ctype(p.type, in_params=True) for p in self._params(func)]
        return f"ctypes.CFUNCTYPE({', '.join([restype, *args])})"

    @staticmethod
    def _params(func: c_ast.FuncDecl) -> list[c_ast.Decl]:
        """Parameters; ``(void)`` and ``()`` both mean none."""
        if func.args is None:
            return []
        params = [p for p in func.args.params if not isinstance(p, c_ast.EllipsisParam)]
        if len(params) == 1 and isinstance(params[0].type, c_ast.TypeDecl):
            inner = params[0].type.type
            if isinstance(inner, c_ast.IdentifierType) and inner.names == ["void"]:
                return []
        return params

    # --- declarations ------------------------------------------------------------------
    def _enum(self, node: c_ast.Enum, name: str, header: str) -> Enum:
        members, value = [], -1
        for item in node.values.enumerators:
            if item.value is not None:
                try:
                    value = evaluate(item.value, self.enum_values)
                except ConstExprError as exc:
                    raise ParseError(f"{header}: {item.name}: {exc}") from exc
            else:
                value += 1
            self.enum_values[item.name] = value
            members.append((item.name, value))
        short = strip_common_prefix([m for m, _ in members], recipe.MEMBER_PREFIXES.get(name))
        clashes = sorted({n for n in short if short.count(n) > 1})
        if clashes:
            raise ParseError(f"{header}: {name}: members would share the Python names {clashes}; "
                             "set its prefix in codegen/recipe.py MEMBER_PREFIXES")
        enum = Enum(name, header, [EnumMember(c, s, v) for (c, v), s in zip(members, short)])
        if node.name:
            self.enum_by_tag[node.name] = enum
        return enum

    def _typedef(self, node: c_ast.Typedef) -> None:
        header = _header_of(node)
        inner = node.type.type if isinstance(node.type, c_ast.TypeDecl) else None
        if isinstance(inner, c_ast.Enum):
            if inner.values is not None:
                enum = self._enum(inner, node.name, header)
                if header in recipe.ENUM_HEADERS:
                    self.enums[node.name] = enum
                    self.declarations.append(enum)
                return
            known = self.enum_by_tag.get(inner.name)
            if known is not None and known.name in self.enums:
                if node.name != known.name:
                    known.aliases.append(node.name)
                self.enums[node.name] = known
                return
        self.typedefs[node.name] = (node.type, header)
        if header not in recipe.DECLARATION_HEADERS:
            return
        if isinstance(inner, c_ast.Struct) and inner.decls is not None:
            fields = []
            for decl in inner.decls:
                fields.append((decl.name, self.ctype(decl.type)))
            struct = Struct(node.name, header, fields)
            self.structs[node.name] = struct
            self.declarations.append(struct)
            return
        if isinstance(node.type, c_ast.PtrDecl) and not isinstance(node.type.type, c_ast.FuncDecl):
            ctype = "ctypes.c_void_p"  # handle types are plain pointers, passed as integers
        else:
            ctype = self.ctype(node.type)
        alias = Alias(node.name, header, ctype)
        self.emitted_aliases[node.name] = alias
        self.declarations.append(alias)

    def _function(self, decl: c_ast.Decl) -> None:
        func = decl.type
        params = self._params(func)
        returns = func.type
        returns_status = (
            isinstance(returns, c_ast.TypeDecl)
            and isinstance(returns.type, c_ast.IdentifierType)
            and returns.type.names == [recipe.STATUS_TYPE]
        )
        self.functions.append(Function(
            name=decl.name,
            restype=self.ctype(returns),
            returns_status=returns_status,
            argtypes=[self.ctype(p.type, in_params=True) for p in params],
            param_names=[p.name or f"arg{i}" for i, p in enumerate(params)],
            prototype=" ".join(self.generator.visit(decl).split()),
        ))

    def walk(self, ast: c_ast.FileAST) -> None:
        for node in ast.ext:
            header = _header_of(node)
            if isinstance(node, c_ast.Typedef):
                self._typedef(node)
            elif isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
                if header in recipe.DECLARATION_HEADERS and "static" not in node.storage:
                    self._function(node)
            elif isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.Enum):
                if node.type.values is not None:  # a tagged enum with no typedef
                    enum = self._enum(node.type, node.type.name, header)
                    if header in recipe.ENUM_HEADERS:
                        self.enums[enum.name] = enum
                        self.declarations.append(enum)
            # FuncDef: static inline helpers, not exported by the library; skipped.


def _raw_defines(text: str) -> list[tuple[str, str]]:
    defines = []
    for match in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(?!\()[ \t]*(.*)$", text, re.M):
        body = re.sub(r"/\*.*?\*/|//.*$", "", match.group(2)).strip()
        if body and match.group(1).startswith(recipe.CONSTANT_PREFIX):
            defines.append((match.group(1), body))
    return defines


def read_constants(text: str, names: dict[str, int]) -> list[Constant]:
    """Integer ``#define`` constants of a header, in header order."""
    parser = c_parser.CParser()
    scope = dict(names)
    constants = []
    for name, body in _raw_defines(text):
        try:
            init = parser.parse(f"unsigned long long __value = ({body});").ext[0].init
            value = evaluate(init, scope)
        except (ConstExprError, c_parser.ParseError) as exc:
            raise ParseError(f"#define {name} {body}: not an integer constant ({exc})") from exc
        scope[name] = value
        constants.append(Constant(name, value))
    return constants


def parse(headers: HeaderSet) -> Bindings:
    source = preprocess(headers.directory)
    ast = c_parser.CParser().parse(source, "cublasLt.h")
    walker = _Walker(headers)
    walker.walk(ast)

    lt_text = (headers.directory / "cublasLt.h").read_text()
    constants = read_constants(lt_text, walker.enum_values)
    attribute_types = read_attribute_types(lt_text, walker.declared)

    attributes = []
    for enum_name, types in attribute_types.items():
        getter = setter = None
        for func in walker.functions:
            if f"{enum_name} attr" in func.prototype or f"{enum_name} " in func.prototype:
                if "GetAttribute" in func.name:
                    getter = func.name
                elif "SetAttribute" in func.name:
                    setter = func.name
        attributes.append(AttributeEnum(enum_name, getter, setter, types))

    external = list(walker.external.values())
    return Bindings(
        version=read_version(headers.directory / "cublas_api.h"),
        sources=headers.provenance,
        declarations=[*external, *walker.declarations],
        functions=walker.functions,
        constants=constants,
        attributes=attributes,
    )
