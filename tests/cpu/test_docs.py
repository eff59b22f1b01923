"""The documentation site's promises, checked without building it (no Sphinx needed):

- every public name (``nvblaslt.__all__``, ``nvblaslt.torch.__all__``) is in the API reference;
- every function, class and method the reference documents has numpydoc sections: Parameters (where
  it takes any), Returns (where it returns something) and Examples; ``MISSING_SECTIONS`` holds today's
  exceptions, and may only shrink;
- the README's and the pages' relative links point at files that exist.

``sphinx-build -W`` (CI's documentation step) checks the rest: that the site builds and its doctests pass.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
API = DOCS / "api.rst"

# "object: section" for each documented callable still without that numpydoc section. Remove an
# entry when you add its section; a new public name or method must come with its sections. Empty now:
# every documented callable has its sections.
MISSING_SECTIONS: set[str] = set()

_DIRECTIVE = re.compile(r"^\.\. (auto(?:function|class|exception|data|module)|data|currentmodule):: ([\w.]+)")
_MEMBERS = re.compile(r"^\s+:members:(.*)$")


def documented() -> dict[str, list[str]]:
    """{qualified name: [documented members]} for each object api.rst documents."""
    found: dict[str, list[str]] = {}
    module = "nvblaslt"
    last = None
    lines = API.read_text().splitlines()
    for index, line in enumerate(lines):
        match = _DIRECTIVE.match(line)
        if match:
            kind, name = match.groups()
            if kind == "currentmodule":
                module = name
                continue
            qualified = name if name.startswith("nvblaslt") else f"{module}.{name}"
            found[qualified] = []
            last = qualified
            continue
        members = _MEMBERS.match(line)
        if members and last is not None:
            text = members.group(1)
            following = index + 1
            while following < len(lines) and lines[following].startswith(" " * 13) and \
                    not lines[following].lstrip().startswith(":"):
                text += lines[following]
                following += 1
            found[last] = [m.strip() for m in text.split(",") if m.strip()]
    return found


def resolve(qualified: str) -> object:
    module_name, _, attribute = qualified.rpartition(".")
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as error:
        if error.name != qualified:  # a module that is there but needs what is not (nvblaslt.torch without torch)
            raise
    return getattr(importlib.import_module(module_name), attribute)


def test_every_public_name_is_in_the_reference():
    names = documented()
    public = [f"nvblaslt.{n}" for n in importlib.import_module("nvblaslt").__all__]
    try:
        public += [f"nvblaslt.torch.{n}" for n in importlib.import_module("nvblaslt.torch").__all__]
    except ImportError:  # torch is optional: its names are checked where it is installed
        pass
    missing = [name for name in public if name not in names]
    assert not missing, f"public names missing from docs/api.rst: {missing}"


def _sections(doc: str) -> set[str]:
    return set(re.findall(r"^\s*(\w[\w ]*)\n\s*-{3,}\s*$", doc, re.MULTILINE))


def _needs(obj: object, owner: type | None) -> set[str]:
    """The numpydoc sections a callable's docstring must have."""
    if isinstance(obj, property) or isinstance(obj, type) and issubclass(obj, BaseException):
        return set()
    function = obj.__init__ if isinstance(obj, type) else obj  # type: ignore[misc]
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return {"Examples"}
    parameters = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    needs = {"Examples"} if owner is None else set()  # methods: an example on the class covers them
    if parameters:
        needs.add("Parameters")
    if not isinstance(obj, type) and signature.return_annotation not in (None, "None", inspect.Signature.empty):
        needs.add("Returns")
    return needs


def missing_sections() -> set[str]:
    found = set()
    for qualified, members in documented().items():
        try:
            obj = resolve(qualified)
        except ImportError:
            continue  # nvblaslt.torch without torch
        if inspect.ismodule(obj) or not callable(obj):
            continue
        checks: list[tuple[str, object, type | None]] = [(qualified, obj, None)]
        for member in members:
            checks.append((f"{qualified}.{member}", inspect.getattr_static(obj, member), obj))  # type: ignore[arg-type]
        for name, target, owner in checks:
            if isinstance(target, (staticmethod, classmethod)):
                target = target.__func__
            doc = inspect.getdoc(target) or ""
            for section in sorted(_needs(target, owner) - _sections(doc)):
                found.add(f"{name}: {section}")
    return found


def test_documented_callables_have_numpydoc_sections():
    found = missing_sections()
    new = sorted(found - MISSING_SECTIONS)
    stale = sorted(MISSING_SECTIONS - found)
    assert not new, f"documented callables without numpydoc sections (add them): {new}"
    assert not stale, f"sections now present: remove these from MISSING_SECTIONS: {stale}"


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))], ids=lambda p: p.name)
def test_relative_links_point_at_files(page: Path):
    broken = [target for target in _LINK.findall(page.read_text())
              if "://" not in target and not (page.parent / target).exists()]
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"


# Words of the team's own notebook that a user of the README cannot follow.
INTERNAL_WORDS = re.compile(r"\bthe seed\b|\bseed code\b|shared/peer|peer_nvmath|\bissue \d+|\bwork items?\b|"
                            r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
SPEED = re.compile(r"\d\.\d+×|\d (?:ms|µs)\b")  # a ratio or a time, not a shape such as 1×1
MACHINE = re.compile(r"\b(?:H100|H200|A100|B200|GH200|L40S?)\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
TIMING_MODE = re.compile(r"synchroni[sz]e|host time|GPU time|graph replay", re.I)


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs and list items, without code blocks."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [p for p in re.split(r"\n\s*\n|\n(?=- )", text) if p.strip()]


def test_readme_has_no_internal_words():
    found = INTERNAL_WORDS.findall((ROOT / "README.md").read_text())
    assert not found, f"README.md: words a user cannot follow: {found}"


def test_internal_words_are_found():  # the check above can fail
    assert INTERNAL_WORDS.search("as the seed does, at 4c9ef84") and INTERNAL_WORDS.search("see issue 33")
    assert not INTERNAL_WORDS.search("cuBLAS 13.10, fp16 (65536,16384), 2026-11-27, a deadbeef")


def test_every_readme_speed_figure_names_its_machine_date_and_timing_mode():
    bare = [p.strip()[:90] for p in _paragraphs((ROOT / "README.md").read_text())
            if SPEED.search(p) and not (MACHINE.search(p) and DATE.search(p) and TIMING_MODE.search(p))]
    assert not bare, f"README.md: speed figures without machine, date or timing mode: {bare}"


def test_every_headline_benchmark_names_its_machine_and_timing_mode():
    text = (DOCS / "benchmarks.md").read_text()
    section = text[text.index("## Headline figures"):]
    rows = [r for r in section[:section.index("\n## ", 3)].splitlines() if r.startswith("| ") and "---" not in r]
    assert len(rows) > 10, "the headline table is gone"
    header, *rows = rows
    assert header.split("|")[-2].strip() == "timing mode"
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert MACHINE.search(cells[-2]), f"no machine: {row[:80]}"
        assert re.match(r"(sync|GPU time, host time hidden|host time|graph replay|CUDA events|wall clock)", cells[-1]), \
            f"timing mode not one of the page's: {row[:80]}"


def test_every_page_is_in_a_toctree():
    toctrees = "".join(re.findall(r"```\{toctree\}(.*?)```", (DOCS / "index.md").read_text(), flags=re.S))
    listed = {line.strip() for line in toctrees.splitlines() if line.strip() and not line.strip().startswith(":")}
    pages = {str(p.relative_to(DOCS).with_suffix("")) for p in DOCS.rglob("*.md") if p.name != "index.md"}
    pages |= {str(p.relative_to(DOCS).with_suffix("")) for p in DOCS.rglob("*.rst")}
    assert not pages - listed, f"pages in no toctree of docs/index.md: {sorted(pages - listed)}"
