"""The package's layering, read from its source with ``ast`` (no import, no GPU).

Four rules, each with an allow-list that holds exactly today's violations:

- no import cycle among a package's own modules (function-level and ``TYPE_CHECKING`` imports
  count: a cycle a lazy import hides is still a cycle);
- no read or write of another object's ``_private`` attribute: only ``self`` / ``cls`` inside
  a class may be reached through, and a sibling module's private names stay its own
  (``_cuda._wait`` and ``from ._cuda import _wait`` both count);
- no handwritten module over 500 lines;
- ``Matmul`` at most 450 lines.

Sizes count code and comments, not docstrings (the API reference is built from those).

A violation missing from its allow-list fails, and so does an allow-listed violation that no
longer occurs: the lists can only shrink. Remove an entry when you remove its violation.
"""

from __future__ import annotations

import ast
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("nvblaslt", "codegen")
GENERATED = "nvblaslt._generated"  # imported by the package, never edited by hand: not checked

MODULE_LINE_LIMIT = 500
CLASS_LINE_LIMITS = {"Matmul": 450}

# Names that start with one underscore but are public protocol: ctypes' and enum's ``_sunder_``
# names are matched separately; these are the namedtuple methods, documented with the underscore.
PUBLIC_UNDERSCORE_NAMES = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


# ----------------------------------------------------------------------------------------------
# The allow-lists: today's violations. They may only shrink.

# Each import cycle as its modules in import order, starting from the smallest name.
ALLOWED_CYCLES: set[tuple[str, ...]] = set()

# {repository path: the private reaches allowed in it, as written}.
ALLOWED_PRIVATE_REACHES: dict[str, set[str]] = {}

# The rule is about this package's objects and modules. Another package's private API is that
# package's business: these roots are left out, each with why it is used at all.
FOREIGN_ROOTS = {
    "torch": "PyTorch's raw current stream (torch._C) skips building a Stream object per call; the bench "
             "compares with torch._addmm_activation and torch._grouped_mm and queues torch.cuda._sleep, which have no "
             "public form",
}


# Handwritten modules over MODULE_LINE_LIMIT lines.
ALLOWED_LONG_MODULES: set[str] = set()

# Classes over their CLASS_LINE_LIMITS, as "path::Class".
ALLOWED_LONG_CLASSES: set[str] = set()


# ----------------------------------------------------------------------------------------------
# Reading the source

@dataclass(frozen=True)
class Source:
    module: str  # dotted name: nvblaslt._plan, nvblaslt (for __init__.py)
    path: str  # repository path, for messages and allow-list keys
    text: str | None  # None: a module that may be imported but is not checked
    is_package: bool  # an __init__.py

    @property
    def package(self) -> str:
        """The package its relative imports start from."""
        return self.module if self.is_package else self.module.rpartition(".")[0]


@dataclass(frozen=True)
class Where:
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def discover(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Source]:
    found = {}
    for package in packages:
        for file in sorted((root / package).rglob("*.py")):
            relative = file.relative_to(root)
            parts = list(relative.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            module = ".".join(parts)
            checked = not (module == GENERATED or module.startswith(GENERATED + "."))
            found[module] = Source(module, relative.as_posix(), file.read_text() if checked else None, is_package)
    return found


def parsed(source: Source) -> ast.Module:
    return ast.parse(source.text, source.path)


# ----------------------------------------------------------------------------------------------
# Rule 1: import cycles

def _imported_base(source: Source, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    parts = source.package.split(".")
    if node.level - 1 >= len(parts):
        return None  # above the top package: not ours
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def imports_of(source: Source, modules: set[str]) -> list[tuple[str, Where]]:
    """(module imported, where) for each import of one of ``modules``, at any depth of the code.

    ``from . import a, b`` imports the modules ``a`` and ``b``; ``from .a import name`` imports
    ``a``, and also ``a.name`` where that is a module; ``import a.b`` imports ``a.b``. A name that
    is no submodule comes from the package's ``__init__``: an import of the package itself. The
    packages the importer lies in are already imported: naming them as a base adds nothing."""
    found = []
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.Import):
            where = Where(source.path, node.lineno)
            found += [(alias.name, where) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom):
            where = Where(source.path, node.lineno)
            base = _imported_base(source, node)
            if base not in modules:
                continue
            enclosing = source.module.startswith(base + ".")
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    found.append((submodule, where))
                    if not enclosing:
                        found.append((base, where))
                else:
                    found.append((base, where))
    return found


def import_graph(sources: dict[str, Source]) -> dict[str, dict[str, list[Where]]]:
    """{importer: {imported: [where]}} among the given modules, the importer's own imports only."""
    modules = set(sources)
    graph: dict[str, dict[str, list[Where]]] = {m: defaultdict(list) for m in sources}
    for source in sources.values():
        if source.text is None:
            continue
        for imported, where in imports_of(source, modules):
            if imported != source.module and where not in graph[source.module][imported]:
                graph[source.module][imported].append(where)
    return graph


def cycles(graph: dict[str, dict[str, list[Where]]]) -> list[tuple[str, ...]]:
    """Every elementary cycle, each as its modules in import order from the smallest name."""
    found = set()
    order = sorted(graph)
    for index, start in enumerate(order):
        # cycles whose smallest module is ``start``: search only among modules after it
        allowed = set(order[index:])
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    found.add(tuple(path))
                elif nxt in allowed and nxt not in path:
                    stack.append((nxt, [*path, nxt]))
    return sorted(found, key=lambda c: (len(c), c))


def describe_cycle(cycle: tuple[str, ...], graph: dict[str, dict[str, list[Where]]]) -> str:
    steps = []
    for a, b in zip(cycle, (*cycle[1:], cycle[0])):
        steps.append(f"    {a} -> {b}  ({', '.join(map(str, graph[a][b]))})")
    return " -> ".join((*cycle, cycle[0])) + "\n" + "\n".join(steps)


# ----------------------------------------------------------------------------------------------
# Rule 2: private reaches

def is_private(name: str) -> bool:
    if not name.startswith("_") or name in PUBLIC_UNDERSCORE_NAMES:
        return False
    dunder = name.startswith("__") and name.endswith("__")
    sunder = len(name) > 2 and name.endswith("_") and not name.startswith("__")  # ctypes' _fields_, enum's _value_
    return not (dunder or sunder)


@dataclass(frozen=True)
class Reach:
    where: Where
    expression: str  # as written, e.g. plan._launch_args or from ._cuda import _wait

    def __str__(self) -> str:
        return f"{self.where}: {self.expression}"


class _ReachFinder(ast.NodeVisitor):
    """Attribute reads and writes ``x._name`` where ``x`` is not ``self``/``cls`` of an enclosing
    class (``super()`` and ``type(self)`` count as ``self``); ``getattr(x, "_name")`` and its
    kin likewise; ``from .sibling import _name``."""

    def __init__(self, source: Source, modules: set[str]):
        self.source = source
        self.modules = modules
        self.reaches: list[Reach] = []
        self.in_class = 0  # depth of enclosing classes (methods and their nested functions count)

    def _own(self, node: ast.expr) -> bool:
        if not self.in_class:
            return False
        if isinstance(node, ast.Name):
            return node.id in ("self", "cls")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "super":
                return True
            if node.func.id == "type" and len(node.args) == 1:
                return self._own(node.args[0])
        return False

    def _add(self, node: ast.AST, expression: str) -> None:
        self.reaches.append(Reach(Where(self.source.path, node.lineno), expression))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        for base in (*node.bases, *node.keywords):
            self.visit(base)
        self.in_class += 1
        for statement in node.body:
            self.visit(statement)
        self.in_class -= 1

    def _submodule(self, node: ast.Attribute) -> bool:
        """``pkg._cuda``: a package's module reached as its attribute (``import pkg._cuda``)."""
        return f"{ast.unparse(node.value)}.{node.attr}" in self.modules

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr) and not self._own(node.value) and not self._submodule(node):
            self._add(node, f"{ast.unparse(node.value)}.{node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and is_private(node.args[1].value)
                and not self._own(node.args[0])):
            self._add(node, f"{func.id}({ast.unparse(node.args[0])}, {node.args[1].value!r})")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _imported_base(self.source, node)
        if base in self.modules:
            for alias in node.names:
                if is_private(alias.name) and f"{base}.{alias.name}" not in self.modules:
                    self._add(node, f"from {'.' * node.level}{node.module or ''} import {alias.name}")


def private_reaches(source: Source, modules: set[str]) -> list[Reach]:
    finder = _ReachFinder(source, modules)
    finder.visit(parsed(source))
    return finder.reaches


# ----------------------------------------------------------------------------------------------
# Rules 3 and 4: sizes

def docstring_lines(source: Source) -> set[int]:
    """The lines of the module's, classes' and functions' docstrings: documentation is not the size
    of a concern, and the API reference is built from them (numpydoc sections run long)."""
    found: set[int] = set()
    for node in ast.walk(parsed(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.update(range(first.lineno, first.end_lineno + 1))
    return found


def line_count(source: Source) -> int:
    return len(source.text.splitlines()) - len(docstring_lines(source))


def class_lengths(source: Source) -> dict[str, int]:
    lengths = {}
    documentation = docstring_lines(source)
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = set(range(first, node.end_lineno + 1))
            lengths[node.name] = len(lines - documentation)
    return lengths


# ----------------------------------------------------------------------------------------------
# The checks, once per session

@dataclass
class Found:
    sources: dict[str, Source]
    graph: dict[str, dict[str, list[Where]]]
    cycles: list[tuple[str, ...]]
    reaches: dict[str, list[Reach]]  # path -> reaches
    long_modules: dict[str, int]
    long_classes: dict[str, int]


def survey(root: Path = ROOT) -> Found:
    sources = discover(root)
    checked = [s for s in sources.values() if s.text is not None]
    graph = import_graph(sources)
    reaches = defaultdict(list)
    for source in checked:
        for reach in private_reaches(source, set(sources)):
            if reach.expression.removeprefix("getattr(").partition(".")[0] not in FOREIGN_ROOTS:
                reaches[source.path].append(reach)
    long_modules = {s.path: n for s in checked if (n := line_count(s)) > MODULE_LINE_LIMIT}
    long_classes = {}
    for source in checked:
        for name, length in class_lengths(source).items():
            if name in CLASS_LINE_LIMITS and length > CLASS_LINE_LIMITS[name]:
                long_classes[f"{source.path}::{name}"] = length
    return Found(sources, graph, cycles(graph), dict(reaches), long_modules, long_classes)


@pytest.fixture(scope="module")
def found() -> Found:
    return survey()


def compare(new: list[str], stale: list[str], rule: str, how_to_fix: str) -> None:
    message = []
    if new:
        message.append(f"{len(new)} new {rule} ({how_to_fix}):\n" + "\n".join(new))
    if stale:
        message.append(f"{len(stale)} allow-listed {rule} no longer found: remove them from the allow-list "
                       "in tests/test_layering.py:\n" + "\n".join(stale))
    if message:
        pytest.fail("\n\n".join(message), pytrace=False)


# ----------------------------------------------------------------------------------------------
# The rules on the package

def test_the_survey_sees_the_whole_package(found):
    """Guards against passing because nothing was read."""
    checked = [s for s in found.sources.values() if s.text is not None]
    assert len(checked) > 20
    assert {"nvblaslt", "nvblaslt._plan", "nvblaslt._descriptors", "nvblaslt._loader", "codegen.parse",
            "codegen.attribute_types", "codegen.__main__", f"{GENERATED}.cublaslt_13"} <= set(found.sources)
    edges = {(a, b) for a, targets in found.graph.items() for b in targets}
    assert {("nvblaslt", "nvblaslt._plan"), ("nvblaslt._plan", "nvblaslt._descriptors"),
            ("codegen.parse", "codegen.attribute_types"), ("codegen.__main__", "codegen.sources")} <= edges
    assert any(b.startswith(GENERATED) for _, b in edges)  # the generated modules are imported ...
    assert not any(a.startswith(GENERATED) for a, _ in edges)  # ... but not read
    assert sum(len(targets) for targets in found.graph.values()) > 60
    assert any(s.path == "nvblaslt/_plan.py" for s in checked)
    assert sum("Matmul" in class_lengths(s) for s in checked) == 1


def test_no_import_cycles(found):
    new = [describe_cycle(c, found.graph) for c in found.cycles if c not in ALLOWED_CYCLES]
    stale = [repr(c) for c in sorted(ALLOWED_CYCLES - set(found.cycles))]
    compare(new, stale, "import cycles", "break them: move what both sides need below both")


def test_no_reaches_into_other_objects_private_names(found):
    new = [str(r) for path, reaches in sorted(found.reaches.items()) for r in reaches
           if r.expression not in ALLOWED_PRIVATE_REACHES.get(path, set())]
    present = {(path, r.expression) for path, reaches in found.reaches.items() for r in reaches}
    stale = [f"{path}: {e}" for path, allowed in sorted(ALLOWED_PRIVATE_REACHES.items())
             for e in sorted(allowed) if (path, e) not in present]
    compare(new, stale, "private reaches", "give the owner a public name for it")


def test_no_long_modules(found):
    new = [f"{path}: {n} lines" for path, n in sorted(found.long_modules.items()) if path not in ALLOWED_LONG_MODULES]
    stale = sorted(ALLOWED_LONG_MODULES - set(found.long_modules))
    compare(new, stale, f"modules over {MODULE_LINE_LIMIT} lines", "split them by concern")


def test_no_long_classes(found):
    new = [f"{key}: {n} lines (limit {CLASS_LINE_LIMITS[key.rpartition('::')[2]]})"
           for key, n in sorted(found.long_classes.items()) if key not in ALLOWED_LONG_CLASSES]
    stale = sorted(ALLOWED_LONG_CLASSES - set(found.long_classes))
    compare(new, stale, "classes over their limit", "move a concern into an object of its own")


# ----------------------------------------------------------------------------------------------
# The detectors on small synthetic packages

def make_package(tmp_path: Path, files: dict[str, str]) -> dict[str, Source]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return discover(tmp_path, ("pkg",))


def edges_of(sources: dict[str, Source]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in import_graph(sources).items() for b in targets}


def test_imports_are_resolved_in_every_form(tmp_path):
    sources = make_package(tmp_path, {
        "pkg/__init__.py": "from ._a import thing\n",
        "pkg/_a.py": """
            from . import _b, _c
            from ._sub import leaf
            from pkg._d import name
            import pkg._e
            def later():
                from ._f import g
            """,
        "pkg/_b.py": "from .. import outside\n",  # above the package: not ours
        "pkg/_c.py": "from . import helper\n",  # a name __init__ defines: the package itself
        "pkg/_d.py": "", "pkg/_e.py": "", "pkg/_f.py": "",
        "pkg/_sub/__init__.py": "from . import leaf\nfrom .. import _a\n",
        "pkg/_sub/leaf.py": "from ..._x import y\nfrom .._b import z\n",
    })
    assert edges_of(sources) == {
        ("pkg", "pkg._a"),
        ("pkg._a", "pkg._b"), ("pkg._a", "pkg._c"), ("pkg._a", "pkg._sub"), ("pkg._a", "pkg._sub.leaf"),
        ("pkg._a", "pkg._d"), ("pkg._a", "pkg._e"), ("pkg._a", "pkg._f"),
        ("pkg._c", "pkg"),
        ("pkg._sub", "pkg._sub.leaf"), ("pkg._sub", "pkg._a"),
        ("pkg._sub.leaf", "pkg._b"),
    }


def test_cycles_are_found_through_lazy_and_type_checking_imports(tmp_path):
    sources = make_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/_a.py": "from . import _b\n",
        "pkg/_b.py": "def f():\n    from ._c import g\n",
        "pkg/_c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import A\n",
        "pkg/_d.py": "from . import _e\n",
        "pkg/_e.py": "from ._d import x\n",
        "pkg/_f.py": "from . import _a, _d\n",  # imports into cycles, but is in none
    })
    graph = import_graph(sources)
    assert cycles(graph) == [("pkg._d", "pkg._e"), ("pkg._a", "pkg._b", "pkg._c")]
    text = describe_cycle(("pkg._d", "pkg._e"), graph)
    assert "pkg._d -> pkg._e -> pkg._d" in text and "pkg/_e.py:1" in text


def test_no_cycles_in_a_layered_package(tmp_path):
    sources = make_package(tmp_path, {
        "pkg/__init__.py": "from ._top import api\n",
        "pkg/_top.py": "from . import _mid, _low\n",
        "pkg/_mid.py": "from ._low import f\nimport pkg._low\n",
        "pkg/_low.py": "import os\n",
    })
    assert cycles(import_graph(sources)) == []


def reaches_in(tmp_path: Path, text: str, extra: dict[str, str] | None = None) -> list[str]:
    sources = make_package(tmp_path, {"pkg/__init__.py": "", "pkg/_cuda.py": "", **(extra or {}),
                                      "pkg/_mod.py": text})
    return [r.expression for r in private_reaches(sources["pkg._mod"], set(sources))]


def test_private_reaches_are_flagged(tmp_path):
    assert reaches_in(tmp_path, """
        from . import _cuda
        from ._cuda import _wait, public
        import pkg._cuda
        def run(plan):
            plan._launch = 1
            return plan._args, _cuda._sync(), pkg._cuda._stream
        class Plan:
            def __init__(self, other):
                self._ok = other._not_ok
                self.launch._inner = 2
                getattr(other, "_hidden")
                setattr(self, "_fine", 1)
            def f(self):
                def inner(x):
                    return x._private
                return inner
        def outside(self):
            return self._looks_like_a_method_but_is_not
        """) == [
        "from ._cuda import _wait", "plan._launch", "plan._args", "_cuda._sync", "pkg._cuda._stream",
        "other._not_ok", "self.launch._inner", "getattr(other, '_hidden')", "x._private",
        "self._looks_like_a_method_but_is_not"]


def test_own_and_public_names_are_not_flagged(tmp_path):
    assert reaches_in(tmp_path, """
        import ctypes
        from . import _cuda, _sub
        from ._sub import _leaf
        _CACHE = {}
        def _helper():
            return _CACHE
        class Plan(ctypes.Structure):
            _fields_ = [("x", ctypes.c_int)]
            def __init__(self):
                self._launch = _helper()
                self.__dict__, self.__class__
            @classmethod
            def make(cls):
                return cls._registry, super()._base, type(self)._count
            def values(self, point):
                return point._replace(x=1), point._asdict(), self._value_, ctypes.sizeof(self)._type_
        """, {"pkg/_sub/__init__.py": "", "pkg/_sub/_leaf.py": ""}) == []


def test_new_and_stale_entries_both_fail():
    compare([], [], "things", "fix them")
    with pytest.raises(pytest.fail.Exception, match=r"1 new things \(fix them\):\nnvblaslt/_a.py:3: x._y"):
        compare(["nvblaslt/_a.py:3: x._y"], [], "things", "fix them")
    with pytest.raises(pytest.fail.Exception, match="1 allow-listed things no longer found"):
        compare([], ["nvblaslt/_a.py: x._y"], "things", "fix them")
