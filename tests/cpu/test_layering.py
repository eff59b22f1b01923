"""The package's layering, read from its source with ``ast`` (no import, no GPU).

Six rules, each with an allow-list whose every entry says why it is there:

- no import cycle among a package's own modules (function-level and ``TYPE_CHECKING`` imports
  count: a cycle a lazy import hides is still a cycle);
- no read or write of another object's ``_private`` attribute, and a sibling module's private
  names stay its own (``_cuda._wait`` and ``from ._cuda import _wait`` both count). ``self._x``
  is the object's own only where ``_x`` is assigned in that class or in a base of it in the same
  module: a base in another module that works on state its subclass sets up is flagged. The one
  exception is the package's declared internal interface: the underscored methods the
  ``typing.Protocol`` classes of ``INTERNAL_PROTOCOLS`` declare (``plan._run``), which the package
  calls and the user's ``Matmul`` does not show;
- no attribute written on another object (``plan.algorithm = …``, ``self.launch.x = …``): the
  owner gets a method, or hands back a value the caller applies. Objects the same scope makes
  from the same module's classes, and the module's own module-level objects, are its own;
- the layers over the core (``CONSUMER_PACKAGES``: ``bench/``, ``torch/``, ``jax/``) import no
  private module of another package (``from .. import _cuda``, ``from .._errors import X``);
- no handwritten module over 500 lines;
- ``Matmul`` at most 450 lines, its bases in the package included.

Roots of another package (``torch._C``) are left out where the name is bound by an import of it
(``import torch``, ``sys.modules["torch"]``), not where a variable merely has its name. Sizes count
code and comments, not docstrings (the API reference is built from those).

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
CONSUMER_PACKAGES = ("nvblaslt.bench", "nvblaslt.torch", "nvblaslt.jax")  # layers over the core

# The module whose Protocol classes declare the package's internal interface (their underscored methods).
INTERNAL_PROTOCOLS = "nvblaslt._protocols"

MODULE_LINE_LIMIT = 500
# Matmul is nvmath-python's whole stateful API in one class (plan, autotune, execute, the three resets,
# free) with the state they share; its resets were a base in another module that worked on that state
# (issue 36), and are folded back in. Its internal methods are underscored and declared in _protocols.
CLASS_LINE_LIMITS = {"Matmul": 540}

# Names that start with one underscore but are public protocol: ctypes' and enum's ``_sunder_``
# names are matched separately; these are the namedtuple methods, documented with the underscore.
PUBLIC_UNDERSCORE_NAMES = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


# ----------------------------------------------------------------------------------------------
# The allow-lists: each entry with why it is there. They may only shrink.

# Each import cycle as its modules in import order, starting from the smallest name.
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {}

_BENCH_TORCH = ("torch reaches the bench's functions as a parameter (imported once, lazily, by the caller), so "
                "no import binds the name; PyTorch's private ops are the baselines it compares against")
_AUTOGRAD_CTX = "torch.autograd's ctx: setup_context saves on it what backward reads (PyTorch's API)"
_ARGUMENTS = "the bench's own argparse/options namespace, filled in with defaults after parsing"
_TESTS_OWN = "torch's autograd: a leaf tensor's gradient reset between the bench's timed steps (PyTorch's API)"

# {repository path: {the private reach as written: why}}.
ALLOWED_PRIVATE_REACHES: dict[str, dict[str, str]] = {
    "nvblaslt/bench/grouped.py": {"torch._grouped_mm": _BENCH_TORCH},
    "nvblaslt/bench/layer.py": {"torch._addmm_activation": _BENCH_TORCH},
    "nvblaslt/bench/percall.py": {"torch._addmm_activation": _BENCH_TORCH},
    "nvblaslt/bench/seed.py": {"torch._addmm_activation": _BENCH_TORCH},
    "nvblaslt/bench/timing.py": {"getattr(torch.cuda, '_sleep')": _BENCH_TORCH, "torch.cuda._sleep": _BENCH_TORCH},
}

# {repository path: {the write as reported ("plan.algorithm = …"): why}}.
ALLOWED_WRITES: dict[str, dict[str, str]] = {
    "codegen/sources.py": {"fetch.STATS.seconds = …": "the fetch module's run statistics, which every source "
                                                      "adds its time to (a counter the report prints)"},
    "nvblaslt/_descriptors.py": {"self.algorithm.workspace_size = …": "nvmath-python's algorithm.workspace_size, "
                                 "set once on the Algorithm this HeuristicResult has just made"},
    "nvblaslt/_dlpack.py": dict.fromkeys(
        ["tensor.data = …", "tensor.device = …", "tensor.dtype = …", "tensor.ndim = …", "tensor.shape = …",
         "tensor.strides = …"], "the fields of the DLPack ctypes struct this function has just made"),
    "nvblaslt/_frameworks.py": dict.fromkeys(["op.conjugated = …", "op.obj = …"],
                                             "the Operand read a line before, given the caller's own tensor back"),
    "nvblaslt/_launch.py": {"value.value = …": "the c_void_p the setter closure made, its contents per call"},
    "nvblaslt/_loader.py": dict.fromkeys(
        ["func.__doc__ = …", "func.argtypes = …", "func.errcheck = …", "func.restype = …",
         "get_version.argtypes = …", "get_version.restype = …"],
        "ctypes' function objects are configured by setting their attributes (ctypes' API)"),
    "nvblaslt/_plan.py": {
        **dict.fromkeys(["launch.a_pointer.value = …", "launch.b_pointer.value = …", "launch.c_pointer.value = …"],
                        "the launch's argument slots, written on matmul()'s fast path: a method call per pointer "
                        "would cost the hot path about 0.1 µs each"),
        "op.obj = …": "forget_arrays drops the Operands' references to the caller's arrays (their pointers stay)"},
    "nvblaslt/_scales.py": {"value.obj = …": "forget_arrays drops the scale Operands' references to the caller's "
                                             "arrays (their pointers stay)"},
    "nvblaslt/_split_bgrad.py": {"sums._allocate_result = …": "the GEMV plan it has just made writes where "
                                 "the fused plan's bias gradient would (its result allocator replaced)"},
    "nvblaslt/_tune.py": {"_tuning_cache.recall_enabled = …": "nvblaslt tune plans from the heuristics alone: the "
                          "tuning cache's switch, set and restored around it"},
    "nvblaslt/bench/cli.py": dict.fromkeys(
        ["args.calls = …", "args.gpu = …", "args.layer_rounds = …", "args.repeats = …", "args.rounds = …",
         "args.search_epilogs = …", "args.search_rounds = …", "args.sections = …", "args.seed_epilogs = …"],
        _ARGUMENTS),
    "nvblaslt/bench/conv.py": {**dict.fromkeys(["options.compile_budget = …", "options.rounds = …",
                                                "options.warmup = …"], _ARGUMENTS), "p.grad = …": _TESTS_OWN},
    "nvblaslt/bench/grouped.py": dict.fromkeys(["weights.grad = …", "x.grad = …"], _TESTS_OWN),
    "nvblaslt/bench/jax.py": dict.fromkeys(["options.activations = …", "options.rounds = …", "options.steps = …",
                                            "options.warmup = …", "options.widths = …"], _ARGUMENTS),
    "nvblaslt/bench/layer.py": dict.fromkeys(
        ["launch.d_argument.value = …", "launch.stream_argument.value = …"],
        "the bench times a bare cublasLtMatmul through a plan's launch slots (its pointer and stream)"),
    "nvblaslt/bench/mlp.py": {**dict.fromkeys(["options.rounds = …", "options.warmup = …"], _ARGUMENTS),
                              "p.grad = …": _TESTS_OWN},
    "nvblaslt/bench/percall.py": dict.fromkeys(["bare.keep = …", "bare_checked.keep = …", "bare_objects.keep = …"],
                                               "the bench's bare-call closures keep their ctypes arguments alive"),
    "nvblaslt/torch/_bound.py": dict.fromkeys(["local.entries = …", "local.generation = …"],
                                              "a threading.local of torch/_bound's own, reached through a helper"),
    "nvblaslt/torch/_conv_ops.py": dict.fromkeys(["ctx.activation = …", "ctx.geometry = …", "ctx.has_bias = …"],
                                                 _AUTOGRAD_CTX),
    "nvblaslt/torch/_layers.py": {"layer.batch_invariant = …": "fuse() sets the switch on the FusedLinear layers "
                                  "it has just made (a public attribute of theirs)"},
    "nvblaslt/torch/_ops.py": dict.fromkeys(["ctx.activation = …", "ctx.has_bias = …", "ctx.linked = …",
                                             "ctx.prev_activation = …", "ctx.prev_has_bias = …"], _AUTOGRAD_CTX),
    "nvblaslt/torch/_pointwise.py": dict.fromkeys(["ctx.activation = …", "ctx.has_bias = …",
                                                   "ctx.step = …"], _AUTOGRAD_CTX),
}

_LAYER_NEEDS = "the layer plans and launches below the public API (issue 36 names these imports for review)"
# {(consumer package, private module it imports): why}.
ALLOWED_PRIVATE_MODULE_IMPORTS: dict[tuple[str, str], str] = {
    ("nvblaslt.bench", "nvblaslt._duel"): "median_bounds, the sign-test bounds the search bench reports",
    ("nvblaslt.bench", "nvblaslt._frameworks"): "framework_of: the bench's baselines read arrays as matmul() does",
    ("nvblaslt.bench", "nvblaslt._launch"): "raw_function: the bare cublasLtMatmul the per-call bench times",
    ("nvblaslt.bench", "nvblaslt._timing"): "shuffled_rounds: the bench's rounds interleaved as autotune's are",
    ("nvblaslt.bench", "nvblaslt._tune_suite"): "llm_suite: the tuning bench measures nvblaslt tune's own problems",
    ("nvblaslt.bench", "nvblaslt._tuning_cache"): "ENV_CACHE_DIR: the bench points the tuning cache elsewhere; key_of "
                                                  "and problem_summary: the tuning bench finds a problem's database "
                                                  "entry and its recall log lines",
    ("nvblaslt.bench", "nvblaslt.torch._conv"): "the conv bench builds the layer's training step from its parts",
    ("nvblaslt.bench", "nvblaslt.torch._im2col"): "the conv bench times the layer's im2col against its baseline",
    ("nvblaslt.jax", "nvblaslt._autotune"): "tuning_iterations: the one check of an autotune context's iterations",
    ("nvblaslt.jax", "nvblaslt._cuda"): "the few CUDA runtime calls the XLA bridge makes (device, stream)",
    ("nvblaslt.jax", "nvblaslt._dlpack"): "read_capsule: an fp8 buffer's pointer, which XLA gives through DLPack alone",
    ("nvblaslt.jax", "nvblaslt._dtypes"): "the element types as JAX names them, read at trace time",
    ("nvblaslt.jax", "nvblaslt._epilogs"): "every epilog rule (inputs, outputs, shapes), which tracing must know",
    ("nvblaslt.jax", "nvblaslt._errors"): "the exception classes, public as nvblaslt.Nvblaslt*Error; the jax "
                                          "helper's to import from nvblaslt",
    ("nvblaslt.jax", "nvblaslt._frameworks"): "PROTOCOL: the adapter for arrays known only by their pointers",
    ("nvblaslt.jax", "nvblaslt._grouped_version"): "require_grouped: ragged_dot refuses an old cuBLASLt at trace",
    ("nvblaslt.jax", "nvblaslt._jit"): "kernel: ragged_dot's call zeroes the rows past the groups' total on the GPU "
                                       "(the group sizes never reach the host, so XLA may capture the call)",
    ("nvblaslt.jax", "nvblaslt._loader"): "library(): the loaded cuBLASLt, which tracing asks what it supports",
    ("nvblaslt.jax", "nvblaslt._memory"): "DeviceBuffer: the grouped GEMM's scratch, made outside XLA's buffers",
    ("nvblaslt.jax", "nvblaslt._operands"): "Operand: JAX's abstract arrays described as the core reads arrays",
    ("nvblaslt.jax", "nvblaslt._options"): "with_shortcuts: the options checked as matmul() checks them",
    ("nvblaslt.jax", "nvblaslt._problem"): "canonical: the problem planned at trace time, " + _LAYER_NEEDS,
    ("nvblaslt.jax", "nvblaslt._scales"): "Scales.check: the fp8 scales checked at trace time as the plan checks them",
    ("nvblaslt.jax", "nvblaslt._strides"): "c_strides: the row-major strides of XLA's buffers",
    ("nvblaslt.torch", "nvblaslt._autotune"): "tuning_iterations: the one check of an autotune context's iterations",
    ("nvblaslt.torch", "nvblaslt._cuda"): "the few CUDA runtime calls the bound GEMMs make (device, capture)",
    ("nvblaslt.torch", "nvblaslt._epilogs"): "the aux outputs' leading dimensions the composite ops allocate",
    ("nvblaslt.torch", "nvblaslt._grouped_problem"): "padded_strides: the grouped op's result layout, allocated "
                                                     "by torch",
    ("nvblaslt.torch", "nvblaslt._plan_cache"): "forget_with_clear: clear_plan_cache() forgets the bound steps too",
    ("nvblaslt.torch", "nvblaslt._tuning_cache"): "the tuning cache's generation, which retires bound plans as "
                                                  "matmul() retires its own",
}

# The rule is about this package's objects and modules. Another package's private API is that
# package's business: these roots (where an import binds them) are left out, each with why it is used at all.
FOREIGN_ROOTS = {
    "torch": "PyTorch's raw current stream (torch._C) skips building a Stream object per call; the bench "
             "compares with torch._addmm_activation and torch._grouped_mm and queues torch.cuda._sleep, which have no "
             "public form",
}

# Handwritten modules over MODULE_LINE_LIMIT lines: {path: why}.
ALLOWED_LONG_MODULES: dict[str, str] = {
    "nvblaslt/_plan.py": "Matmul whole, its resets folded back in (issue 36): one class's shared state in one module, "
                         "not a base in another module working on it; CLASS_LINE_LIMITS says why the class is long"}

# Classes over their CLASS_LINE_LIMITS, bases included: {"path::Class": why}.
ALLOWED_LONG_CLASSES: dict[str, str] = {}


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
# Rules 2 and 3: private reaches and writes into other objects

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


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
IMPORTED = "import"  # a scope's binding made by an import: the module's dotted name follows


def _scope_nodes(scope: ast.AST):
    """The nodes of one scope: its body, without the bodies of the functions and classes in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _module_named(value: ast.expr) -> str | None:
    """``m`` where ``value`` imports it by name: ``sys.modules["m"]``, ``sys.modules.get("m")``,
    ``importlib.import_module("m")``."""
    if isinstance(value, ast.Subscript) and ast.unparse(value.value) == "sys.modules":
        key = value.slice
    elif isinstance(value, ast.Call) and ast.unparse(value.func) in ("sys.modules.get", "importlib.import_module") \
            and value.args:
        key = value.args[0]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def scope_bindings(scope: ast.AST, source: Source) -> dict[str, tuple[str, str | None]]:
    """{name: (how it is bound, what)} in one scope: (IMPORTED, dotted module) for an import,
    ("new", class name) for ``x = Class(...)``, ("other", None) for anything else (a parameter, an
    assignment, a loop variable)."""
    bound: dict[str, tuple[str, str | None]] = {}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        arguments = scope.args
        for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                         *filter(None, (arguments.vararg, arguments.kwarg))):
            bound[argument.arg] = ("other", None)
    declared_global = {name for node in _scope_nodes(scope) if isinstance(node, (ast.Global, ast.Nonlocal))
                       for name in node.names}
    for node in _scope_nodes(scope):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (IMPORTED, alias.name)
                else:
                    top = alias.name.partition(".")[0]
                    bound[top] = (IMPORTED, top)
        elif isinstance(node, ast.ImportFrom):
            base = _imported_base(source, node) or ""
            for alias in node.names:
                bound[alias.asname or alias.name] = (IMPORTED, f"{base}.{alias.name}")
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if (module := _module_named(value)) is not None:
                bound[name] = (IMPORTED, module)
            elif name not in bound or bound[name][0] != IMPORTED:
                made = value.func if isinstance(value, ast.Call) else None
                bound[name] = ("new", ast.unparse(made)) if made is not None else ("other", None)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.setdefault(node.id, ("other", None))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.setdefault(node.name, ("other", None))
    for name in declared_global:  # the enclosing scope's binding, not this one's
        bound.pop(name, None)
    return bound


def declared_names(node: ast.ClassDef) -> set[str]:
    """The names a class's body annotates without assigning them."""
    return {statement.target.id for statement in node.body if isinstance(statement, ast.AnnAssign)
            and statement.value is None and isinstance(statement.target, ast.Name)}


def own_names(node: ast.ClassDef) -> set[str]:
    """The names a class itself assigns: its body's names and methods, and ``self.x`` / ``cls.x``
    written in its methods. An annotation alone declares, it does not assign (a dataclass's field does)."""
    dataclass_like = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
    names: set[str] = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            names.update(t.id for target in statement.targets for t in ast.walk(target) if isinstance(t, ast.Name))
        elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)) and isinstance(statement.target, ast.Name):
            if statement.value is not None or dataclass_like or isinstance(statement, ast.AugAssign):
                names.add(statement.target.id)
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) \
                and isinstance(inner.value, ast.Name) and inner.value.id in ("self", "cls"):
            names.add(inner.attr)
        elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "setattr" \
                and len(inner.args) >= 2 and ast.unparse(inner.args[0]) in ("self", "cls") \
                and isinstance(inner.args[1], ast.Constant):
            names.add(inner.args[1].value)
    return names


def declared_internal_names(source: Source | None) -> frozenset[str]:
    """The underscored methods the ``typing.Protocol`` classes of ``source`` declare: the package's
    internal interface, which any of its modules may call (``plan._run``)."""
    if source is None or source.text is None:
        return frozenset()
    names = set()
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b).rpartition(".")[2] == "Protocol"
                                                  for b in node.bases):
            names.update(statement.name for statement in node.body
                         if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and is_private(statement.name))
    return frozenset(names)


def module_classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def class_own_names(name: str, classes: dict[str, ast.ClassDef], seen: frozenset = frozenset()) -> set[str]:
    """What a class owns: its own names and those of its bases defined in the same module. A base in
    another module is another module's code: what it assigns is not this class's to reach."""
    node = classes[name]
    names = own_names(node)
    # a declaration that subclasses of the same module fill in (a C descriptor's destroy function) is the
    # module's own template; one that only another module's subclass assigns is a reach into that module
    assigned_here = set().union(*(own_names(other) for other in classes.values() if other is not node))
    names |= declared_names(node) & assigned_here
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
            names |= class_own_names(base.id, classes, seen | {name})
    return names


class _ReachFinder(ast.NodeVisitor):
    """Attribute reads and writes ``x._name`` where ``x`` is not ``self``/``cls`` of an enclosing
    class (``super()`` and ``type(self)`` count as ``self``), or is but the class (with its bases in
    the same module) never assigns ``_name``; ``getattr(x, "_name")`` and its kin likewise;
    ``from .sibling import _name``. A root another package's import binds (``FOREIGN_ROOTS``) is
    left out. Beside them, ``writes``: attributes set on another object (``plan.algorithm = …``,
    ``self.launch.x = …``, ``setattr(other, …)``), unless that object is made in the same scope
    by a class of the same module, or is a module-level object of the same module. ``internal``: the
    underscored names a protocol declares (``declared_internal_names``), not reaches."""

    def __init__(self, source: Source, modules: set[str], foreign_roots=None, internal: frozenset[str] = frozenset()):
        self.source = source
        self.modules = modules
        self.foreign_roots = set(FOREIGN_ROOTS if foreign_roots is None else foreign_roots)
        self.internal = internal
        self.reaches: list[Reach] = []
        self.writes: list[Reach] = []
        self.tree = parsed(source)
        self.classes = module_classes(self.tree)
        self.class_stack: list[str] = []  # enclosing classes, innermost last (methods' nested functions count)
        self.scopes = [scope_bindings(self.tree, source)]

    def run(self) -> None:
        self.visit(self.tree)

    # -- what a name is
    def _binding(self, name: str) -> tuple[str, str | None] | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def _is_self(self, node: ast.expr) -> bool:
        if not self.class_stack:
            return False
        if isinstance(node, ast.Name):
            return node.id in ("self", "cls")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "super":
                return True
            if node.func.id == "type" and len(node.args) == 1:
                return self._is_self(node.args[0])
        return False

    def _owns(self, node: ast.expr, name: str) -> bool:
        return self._is_self(node) and name in class_own_names(self.class_stack[-1], self.classes)

    def _foreign(self, node: ast.expr) -> bool:
        """Whether ``node``'s root name is bound by an import of another package named in FOREIGN_ROOTS."""
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            node = node.func if isinstance(node, ast.Call) else node.value
        if not isinstance(node, ast.Name):
            return False
        binding = self._binding(node.id)
        return binding is not None and binding[0] == IMPORTED and (binding[1] or "").partition(".")[0] \
            in self.foreign_roots

    def _add(self, found: list, node: ast.AST, expression: str) -> None:
        found.append(Reach(Where(self.source.path, node.lineno), expression))

    # -- scopes
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        for base in (*node.bases, *node.keywords):
            self.visit(base)
        self.class_stack.append(node.name)
        self.scopes.append(scope_bindings(node, self.source))
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()
        self.class_stack.pop()

    def _visit_function(self, node) -> None:
        self.scopes.append(scope_bindings(node, self.source))
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    # -- reaches
    def _submodule(self, node: ast.Attribute) -> bool:
        """``pkg._cuda``: a package's module reached as its attribute (``import pkg._cuda``)."""
        return f"{ast.unparse(node.value)}.{node.attr}" in self.modules

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if is_private(node.attr) and node.attr not in self.internal and not self._owns(node.value, node.attr) \
                and not self._submodule(node) and not self._foreign(node.value):
            self._add(self.reaches, node, f"{ast.unparse(node.value)}.{node.attr}")
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._write(node, node.value, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            target, name = node.args[0], node.args[1].value
            if is_private(name) and not self._owns(target, name) and not self._foreign(target):
                self._add(self.reaches, node, f"{func.id}({ast.unparse(target)}, {name!r})")
            if func.id in ("setattr", "delattr"):
                self._write(node, target, name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _imported_base(self.source, node)
        if base in self.modules:
            for alias in node.names:
                if is_private(alias.name) and f"{base}.{alias.name}" not in self.modules:
                    self._add(self.reaches, node, f"from {'.' * node.level}{node.module or ''} import {alias.name}")

    # -- writes
    def _write(self, node: ast.AST, target: ast.expr, name: str) -> None:
        if self._is_self(target) or self._foreign(target):
            return
        if name == "value" and self._is_self(_root(target)):
            return  # the contents of the object's own ctypes slot (c_void_p), the slot itself unchanged
        if isinstance(target, ast.Name):
            binding = self._binding(target.id)
            module_level = self.scopes[0].get(target.id)
            if binding is not None and binding[0] == "new" and _constructor(binding[1] or "", self.classes):
                return  # an object made here, not yet handed to anyone
            if module_level is not None and module_level[0] != IMPORTED and binding is module_level:
                return  # a module-level object of this module's (a threading.local, a cache)
        self._add(self.writes, node, f"{ast.unparse(target)}.{name} = …")


def _root(node: ast.expr) -> ast.expr:
    """``self`` of ``self.a.b[0]``."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _constructor(called: str, classes: dict[str, ast.ClassDef]) -> bool:
    """Whether ``called`` (as written) makes a new object: a class of the same module, ``cls``, a class
    by its CamelCase name, a ctypes type (``c_void_p``) or a C struct of the bindings (``…_t``)."""
    last = called.rpartition(".")[2]
    return called in classes or called in ("cls", "cls.__new__") or last[:1].isupper() or last.startswith("c_") \
        or last.endswith("_t")


def private_reaches(source: Source, modules: set[str], foreign_roots=None,
                    internal: frozenset[str] = frozenset()) -> list[Reach]:
    finder = _ReachFinder(source, modules, foreign_roots, internal)
    finder.run()
    return finder.reaches


def foreign_writes(source: Source, modules: set[str], foreign_roots=None) -> list[Reach]:
    finder = _ReachFinder(source, modules, foreign_roots)
    finder.run()
    return finder.writes


# ----------------------------------------------------------------------------------------------
# Rule 4: the layers over the core import its public names only

def private_module_imports(source: Source, modules: set[str]) -> list[tuple[str, Where]]:
    """(private module of another package, where) for each such import by a module of a consumer
    package (``CONSUMER_PACKAGES``): ``from .. import _cuda``, ``from .._errors import X``."""
    consumer = next((p for p in CONSUMER_PACKAGES if source.module == p or source.module.startswith(p + ".")), None)
    if consumer is None:
        return []
    found = []
    for imported, where in imports_of(source, modules):
        if imported == consumer or imported.startswith(consumer + "."):
            continue  # the consumer's own modules
        if any(is_private(part) for part in imported.split(".")):
            found.append((imported, where))
    return found


# ----------------------------------------------------------------------------------------------
# Rules 5 and 6: sizes

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
    """Each class's own lines, its bases' not counted (``class_sizes`` adds them)."""
    lengths = {}
    documentation = docstring_lines(source)
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = set(range(first, node.end_lineno + 1))
            lengths[node.name] = len(lines - documentation)
    return lengths


def class_sizes(sources: dict[str, Source]) -> dict[str, int]:
    """{"path::Class": its lines and those of every base of the package it inherits from}: a class
    split into a base in another module is still one class to read. Bases are found by import."""
    checked = {m: s for m, s in sources.items() if s.text is not None}
    lengths = {m: class_lengths(s) for m, s in checked.items()}
    bases: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for module, source in checked.items():
        tree = parsed(source)
        bindings = scope_bindings(tree, source)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            found = []
            for base in node.bases:
                if not isinstance(base, ast.Name):
                    continue
                if base.id in lengths[module]:
                    found.append((module, base.id))
                elif bindings.get(base.id, ("", None))[0] == IMPORTED:
                    home, _, name = (bindings[base.id][1] or "").rpartition(".")
                    if name in lengths.get(home, {}):
                        found.append((home, name))
            bases[(module, node.name)] = found

    def size(key: tuple[str, str], seen: frozenset) -> int:
        return lengths[key[0]][key[1]] + sum(size(b, seen | {key}) for b in bases.get(key, ()) if b not in seen)
    return {f"{checked[m].path}::{name}": size((m, name), frozenset()) for m, names in lengths.items()
            for name in names}


# ----------------------------------------------------------------------------------------------
# The checks, once per session

@dataclass
class Found:
    sources: dict[str, Source]
    graph: dict[str, dict[str, list[Where]]]
    cycles: list[tuple[str, ...]]
    reaches: dict[str, list[Reach]]  # path -> reaches
    writes: dict[str, list[Reach]]  # path -> writes into other objects
    module_imports: list[tuple[str, str, Where]]  # (consumer package, private module, where)
    long_modules: dict[str, int]
    long_classes: dict[str, int]


def consumer_of(module: str) -> str | None:
    return next((p for p in CONSUMER_PACKAGES if module == p or module.startswith(p + ".")), None)


def survey(root: Path = ROOT) -> Found:
    sources = discover(root)
    checked = [s for s in sources.values() if s.text is not None]
    graph = import_graph(sources)
    reaches, writes = defaultdict(list), defaultdict(list)
    module_imports = []
    internal = declared_internal_names(sources.get(INTERNAL_PROTOCOLS))
    for source in checked:
        finder = _ReachFinder(source, set(sources), internal=internal)
        finder.run()
        reaches[source.path] += finder.reaches
        writes[source.path] += finder.writes
        consumer = consumer_of(source.module)
        module_imports += [(consumer, imported, where) for imported, where in private_module_imports(source,
                                                                                                    set(sources))]
    long_modules = {s.path: n for s in checked if (n := line_count(s)) > MODULE_LINE_LIMIT}
    long_classes = {key: n for key, n in class_sizes(sources).items()
                    if (limit := CLASS_LINE_LIMITS.get(key.rpartition("::")[2])) is not None and n > limit}
    return Found(sources, graph, cycles(graph), {p: r for p, r in reaches.items() if r},
                 {p: w for p, w in writes.items() if w}, module_imports, long_modules, long_classes)


@pytest.fixture(scope="module")
def found() -> Found:
    return survey()


def compare(new: list[str], stale: list[str], rule: str, how_to_fix: str) -> None:
    message = []
    if new:
        message.append(f"{len(new)} new {rule} ({how_to_fix}):\n" + "\n".join(new))
    if stale:
        message.append(f"{len(stale)} allow-listed {rule} no longer found: remove them from the allow-list "
                       "in tests/cpu/test_layering.py:\n" + "\n".join(stale))
    if message:
        pytest.fail("\n\n".join(message), pytrace=False)


def compare_per_path(found: dict[str, list[Reach]], allowed: dict[str, dict[str, str]], rule: str,
                     how_to_fix: str) -> None:
    new = [str(r) for path, reaches in sorted(found.items()) for r in reaches
           if r.expression not in allowed.get(path, {})]
    present = {(path, r.expression) for path, reaches in found.items() for r in reaches}
    stale = [f"{path}: {e}" for path, entries in sorted(allowed.items()) for e in sorted(entries)
             if (path, e) not in present]
    compare(new, stale, rule, how_to_fix)


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
    assert {consumer_of(s.module) for s in checked} >= set(CONSUMER_PACKAGES)  # the layers are read too


def test_every_allow_list_entry_says_why():
    reasons = [*ALLOWED_CYCLES.values(), *ALLOWED_PRIVATE_MODULE_IMPORTS.values(), *FOREIGN_ROOTS.values(),
               *ALLOWED_LONG_MODULES.values(), *ALLOWED_LONG_CLASSES.values(),
               *(why for entries in (*ALLOWED_PRIVATE_REACHES.values(), *ALLOWED_WRITES.values())
                 for why in entries.values())]
    assert all(isinstance(why, str) and len(why.split()) >= 4 for why in reasons)


def test_no_import_cycles(found):
    new = [describe_cycle(c, found.graph) for c in found.cycles if c not in ALLOWED_CYCLES]
    stale = [repr(c) for c in sorted(set(ALLOWED_CYCLES) - set(found.cycles))]
    compare(new, stale, "import cycles", "break them: move what both sides need below both")


def test_no_reaches_into_other_objects_private_names(found):
    compare_per_path(found.reaches, ALLOWED_PRIVATE_REACHES, "private reaches", "give the owner a public name "
                     "for it, or assign the state in the class that reads it")


def test_no_writes_into_other_objects(found):
    compare_per_path(found.writes, ALLOWED_WRITES, "writes into other objects", "give the owner a method, or "
                     "return a value the owner applies")


def test_the_layers_import_no_private_module_of_the_core(found):
    present = {(consumer, imported) for consumer, imported, _ in found.module_imports}
    new = [f"{where}: {consumer} imports {imported}" for consumer, imported, where in found.module_imports
           if (consumer, imported) not in ALLOWED_PRIVATE_MODULE_IMPORTS]
    stale = [f"{consumer}: {imported}" for consumer, imported in sorted(set(ALLOWED_PRIVATE_MODULE_IMPORTS) - present)]
    compare(new, stale, "private-module imports by a layer over the core", "import the name from nvblaslt (or "
            "nvblaslt.lt), or make the module public")


def test_no_long_modules(found):
    new = [f"{path}: {n} lines" for path, n in sorted(found.long_modules.items()) if path not in ALLOWED_LONG_MODULES]
    stale = sorted(set(ALLOWED_LONG_MODULES) - set(found.long_modules))
    compare(new, stale, f"modules over {MODULE_LINE_LIMIT} lines", "split them by concern")


def test_no_long_classes(found):
    new = [f"{key}: {n} lines with its bases (limit {CLASS_LINE_LIMITS[key.rpartition('::')[2]]})"
           for key, n in sorted(found.long_classes.items()) if key not in ALLOWED_LONG_CLASSES]
    stale = sorted(set(ALLOWED_LONG_CLASSES) - set(found.long_classes))
    compare(new, stale, "classes over their limit", "move a concern into an object of its own")


# ----------------------------------------------------------------------------------------------
# The detectors on small synthetic packages

def make_package(tmp_path: Path, files: dict[str, str], package: str = "pkg") -> dict[str, Source]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return discover(tmp_path, (package,))


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
        class Base:
            _base = 0
        class Plan(Base, ctypes.Structure):
            _fields_ = [("x", ctypes.c_int)]
            _registry: dict = {}
            _count = 0
            def __init__(self):
                self._launch = _helper()
                self.__dict__, self.__class__
            @classmethod
            def make(cls):
                return cls._registry, super()._base, type(self)._count
            def values(self, point):
                return point._replace(x=1), point._asdict(), self._value_, ctypes.sizeof(self)._type_
        """, {"pkg/_sub/__init__.py": "", "pkg/_sub/_leaf.py": ""}) == []


def test_only_the_declared_internal_interface_may_be_called_underscored(tmp_path):
    sources = make_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/_protocols.py": """
            from typing import Protocol
            class Internals(Protocol):
                def _run(self, stream: int) -> None: ...
                def public(self) -> None: ...
            class NotAProtocol:
                def _hidden(self) -> None: ...
            """,
        "pkg/_mod.py": """
            def call(plan, Plan):
                plan._run(0)
                Plan._run
                plan._hidden()
                plan._state
            """})
    internal = declared_internal_names(sources["pkg._protocols"])
    assert internal == {"_run"}
    found = private_reaches(sources["pkg._mod"], set(sources), internal=internal)
    assert [r.expression for r in found] == ["plan._hidden", "plan._state"]
    assert declared_internal_names(None) == frozenset()


def test_the_package_declares_its_internal_interface(found):
    """The rule's exemption is read from the real protocols: without them the package's calls are reaches."""
    internal = declared_internal_names(found.sources[INTERNAL_PROTOCOLS])
    assert {"_run", "_rebind", "_trial_run", "_apply_tuning", "_from_operands"} <= internal
    source = found.sources["nvblaslt._function_form"]
    assert "plan._run" in {r.expression for r in private_reaches(source, set(found.sources))}
    assert not private_reaches(source, set(found.sources), internal=internal)


def test_new_and_stale_entries_both_fail():
    compare([], [], "things", "fix them")
    with pytest.raises(pytest.fail.Exception, match=r"1 new things \(fix them\):\nnvblaslt/_a.py:3: x._y"):
        compare(["nvblaslt/_a.py:3: x._y"], [], "things", "fix them")
    with pytest.raises(pytest.fail.Exception, match="1 allow-listed things no longer found"):
        compare([], ["nvblaslt/_a.py: x._y"], "things", "fix them")


def test_state_from_a_base_or_subclass_in_another_module_is_flagged(tmp_path):
    assert reaches_in(tmp_path, """
        from ._base import Half
        class Descriptor:
            _destroy: str  # a template the same module's subclasses fill in
            def close(self):
                return self._destroy, self._undeclared
        class Layout(Descriptor):
            _destroy = "destroy_layout"
        class Plan(Half):
            def run(self):
                return self._state, self._helper()  # assigned by the base in _base.py: not this module's
        class Inside:
            def __init__(self):
                self._kept = 1
            def use(self):
                return self._kept
        """, {"pkg/_base.py": "class Half:\n    def _helper(self):\n        self._state = 1\n"}) == [
        "self._undeclared", "self._state", "self._helper"]


def test_another_packages_root_is_left_out_only_where_an_import_binds_it(tmp_path):
    assert reaches_in(tmp_path, """
        import sys
        import torch
        def ok():
            return torch._C
        def also_ok():
            torch = sys.modules["torch"]
            return torch._C
        def flagged(torch):
            return torch._grouped_mm
        """) == ["torch._grouped_mm"]


def writes_in(tmp_path: Path, text: str) -> list[str]:
    sources = make_package(tmp_path, {"pkg/__init__.py": "", "pkg/_other.py": "", "pkg/_mod.py": text})
    return [r.expression for r in foreign_writes(sources["pkg._mod"], set(sources))]


def test_writes_into_other_objects_are_flagged(tmp_path):
    assert writes_in(tmp_path, """
        import ctypes
        import threading
        from . import _other
        _local = threading.local()
        class Record:
            pass
        def tune(plan, cache):
            plan.tuning_report = 1
            cache.last_key = None
            setattr(plan, "split_form", None)
            _other.switch = False
            record = Record()
            record.kept = 1
            slot = ctypes.c_void_p()
            slot.value = 3
            _local.plans = {}
            found = cache.get(1)
            found.fast = 2
        class Plan:
            def __init__(self, launch):
                self.launch = launch
                self.slot = ctypes.c_void_p()
            def bind(self, pointer):
                self.slot.value = pointer
                self.launch.algorithms = []
                self.launch.a_pointer.value = pointer
        """) == ["plan.tuning_report = …", "cache.last_key = …", "plan.split_form = …", "_other.switch = …",
                 "found.fast = …", "self.launch.algorithms = …"]


def test_the_layers_private_module_imports_are_found(tmp_path):
    sources = make_package(tmp_path, {
        "nvblaslt/__init__.py": "", "nvblaslt/_cuda.py": "", "nvblaslt/lt.py": "", "nvblaslt/torch/__init__.py": "",
        "nvblaslt/torch/_ops.py": "",
        "nvblaslt/torch/_layers.py": "from .. import _cuda, lt, Matmul\nfrom ._ops import op\nfrom . import _ops\n",
    }, "nvblaslt")
    found = private_module_imports(sources["nvblaslt.torch._layers"], set(sources))
    assert [imported for imported, _ in found] == ["nvblaslt._cuda"]
    assert private_module_imports(sources["nvblaslt.lt"], set(sources)) == []  # the core is no consumer


def test_a_class_size_includes_its_bases_in_other_modules(tmp_path):
    sources = make_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/_half.py": "class Half:\n    def a(self):\n        return 1\n",
        "pkg/_plan.py": 'from ._half import Half\nclass Plan(Half):\n    """doc"""\n    x = 1\n',
    })
    sizes = class_sizes(sources)
    assert sizes["pkg/_half.py::Half"] == 3 and sizes["pkg/_plan.py::Plan"] == 2 + 3
