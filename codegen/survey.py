"""Run the generator over every cuBLAS release on the package index and report what changed.

    python -m codegen.survey [--out FILE] [SPEC ...]     SPEC: nvidia-cublas==13.0.2.14

Without SPECs it takes every release of each pinned cuBLAS wheel that ``pip index versions``
lists. Each release's headers are read out of its wheel (kept in the per-user cache, see
``python -m codegen --help``);
library_types.h from the CUDA runtime wheel its major's pin names. Prints a Markdown report:
per release the API size, per step what was added and removed, and whether each committed
module (generated from the newest release of its major) serves every release of that major:
nothing it shares with an older release may differ in value, Python name, prototype, struct
layout or attribute type (opaque storage may grow; ``*_END`` sentinels count members and grow
too). Exits 1 if a release fails to generate or a module conflicts.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import sources
from .model import Bindings
from .pipeline import generate, summary


@dataclass
class Api:
    """What a bindings module promises, keyed by C name, in comparable form."""

    spec: str
    major: int
    summary: str
    functions: dict[str, tuple]  # name -> (restype, argtypes)
    enums: dict[str, set[str]]  # enum -> member C names
    members: dict[str, tuple[str, int]]  # member C name -> (Python name, value)
    structs: dict[str, list]  # name -> fields
    attribute_types: dict[str, tuple[str, bool]]  # member C name -> (ctype, is_array)

    @property
    def version(self) -> str:
        return self.spec.split("==")[1]

    @classmethod
    def of(cls, spec: str, major: int, bindings: Bindings) -> Api:
        enums = [d for d in bindings.declarations if d.kind == "enum"]
        return cls(
            spec, major, summary(bindings),
            {f.name: (f.restype, tuple(f.argtypes)) for f in bindings.functions},
            {e.name: {m.c_name for m in e.members} for e in enums},
            {m.c_name: (m.name, m.value) for e in enums for m in e.members},
            {d.name: d.fields for d in bindings.declarations if d.kind == "struct"},
            {t.member: (t.ctype, t.is_array) for a in bindings.attributes for t in a.types},
        )


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def releases_on_index(dist_name: str) -> list[str]:
    """Every release of one distribution that pip sees, oldest first."""
    result = subprocess.run([sys.executable, "-m", "pip", "index", "versions", dist_name],
                            capture_output=True, text=True)
    match = re.search(r"^Available versions: (.+)$", result.stdout, re.M)
    if result.returncode != 0 or not match:
        raise sources.SourceError(f"pip index versions {dist_name} failed:\n{result.stderr.strip()}")
    return [f"{dist_name}=={v}" for v in sorted(match.group(1).split(", "), key=_version_key)]


def _cublas_wheel(pin: sources.Pin) -> str:
    return pin.headers["cublasLt.h"]["wheel"]


def _api(spec: str, pins: dict[str, sources.Pin]) -> Api:
    name, version = spec.split("==")
    header = next(sources.wheel_headers(name, version).rglob("cublasLt.h"))
    major = sources.read_version(header.parent / "cublas_api.h")[0]
    pin = pins.get(f"cuda{major}")
    if pin is None:
        raise sources.SourceError(f"no pin for cuBLAS {major} (headers/pins/cuda{major}.json) names a runtime wheel")
    runtime = pin.headers["library_types.h"]["wheel"]
    runtime_dir = next(sources.wheel_headers(runtime, pin.wheels[runtime]).rglob("library_types.h")).parent
    with sources.from_path(header, [runtime_dir]) as headers:
        _, bindings = generate(headers)
    return Api.of(spec, major, bindings)


def _names(items) -> str:
    return ", ".join(f"`{n}`" for n in sorted(items)) or "—"


def _step(old: Api, new: Api) -> list[str]:
    added = set(new.members) - set(old.members)
    removed = set(old.members) - set(new.members)
    lines = [f"## {old.version} → {new.version}", ""]
    facts = [
        ("functions added", set(new.functions) - set(old.functions)),
        ("functions removed", set(old.functions) - set(new.functions)),
        ("enums added", set(new.enums) - set(old.enums)),
        ("enums removed", set(old.enums) - set(new.enums)),
        (f"enum members added ({len(added)})", added),
        (f"enum members removed ({len(removed)})", removed),
    ]
    changed = [(label, items) for label, items in facts if items]
    lines += [f"- {label}: {_names(items)}" for label, items in changed] or ["- no change to the API"]
    return [*lines, ""]


def _holds(fields: list, older_fields: list) -> bool:
    """Whether a struct serves where an older release had ``older_fields``: the same fields, or,
    for opaque storage (one ``data`` array the library fills), an array at least as long."""
    if fields == older_fields:
        return True
    opaque = re.compile(r"^\((\S+) \* (\d+)\)$")
    if len(fields) == len(older_fields) == 1 and fields[0][0] == older_fields[0][0] == "data":
        new, old = opaque.match(fields[0][1]), opaque.match(older_fields[0][1])
        return bool(new and old and new[1] == old[1] and int(new[2]) >= int(old[2]))
    return False


def conflicts(module: Api, release: Api) -> list[str]:
    """What ``module`` states differently from ``release`` about a name both declare."""
    found = []
    for name in module.functions.keys() & release.functions.keys():
        if module.functions[name] != release.functions[name]:
            found.append(f"function `{name}`: {release.functions[name]} → {module.functions[name]}")
    for name in module.members.keys() & release.members.keys():
        if name.endswith("_END"):  # a sentinel that counts the members: it grows with them
            continue
        if module.members[name] != release.members[name]:
            found.append(f"enum member `{name}` (Python name, value): "
                         f"{release.members[name]} → {module.members[name]}")
    for name in module.structs.keys() & release.structs.keys():
        if not _holds(module.structs[name], release.structs[name]):
            found.append(f"struct `{name}`: fields {release.structs[name]} → {module.structs[name]}")
    for name in module.attribute_types.keys() & release.attribute_types.keys():
        if module.attribute_types[name] != release.attribute_types[name]:
            found.append(f"attribute `{name}` type: {release.attribute_types[name]} → "
                         f"{module.attribute_types[name]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen.survey", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("specs", nargs="*", help="releases (default: every release on the index)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)

    pins = {p.name: p for p in sources.pins()}
    specs = args.specs or [s for p in pins.values() for s in releases_on_index(_cublas_wheel(p))]
    lines = ["# Bindings across cuBLAS releases", "",
             "Generated by `python -m codegen.survey`: the generator run over every release of the cuBLAS "
             "wheels on the package index.", "",
             "| release | generated API |", "|---|---|"]
    apis: list[Api] = []
    failed = []
    for spec in specs:
        try:
            api = _api(spec, pins)
        except (sources.SourceError, RuntimeError) as exc:
            failed.append(spec)
            lines.append(f"| `{spec}` | **generation failed**: {str(exc).splitlines()[0]} |")
            print(f"{spec}: FAILED: {exc}", file=sys.stderr)
            continue
        apis.append(api)
        lines.append(f"| `{spec}` | {api.summary} |")
        print(f"{spec}: {api.summary}", file=sys.stderr)

    steps: list[str] = []
    for older, newer in zip(apis, apis[1:]):
        if older.major == newer.major:
            steps += _step(older, newer)

    compatibility = ["## The committed modules against every release of their major", ""]
    conflicted = 0
    for pin in pins.values():
        module_spec = f"{_cublas_wheel(pin)}=={pin.wheels[_cublas_wheel(pin)]}"
        module = next((a for a in apis if a.spec == module_spec), None)
        if module is None:
            compatibility.append(f"- `{pin.module.name}` ({module_spec}): not surveyed")
            continue
        same_major = [a for a in apis if a.major == module.major and a is not module]
        problems = [(a.version, c) for a in same_major for c in conflicts(module, a)]
        conflicted += len(problems)
        compatibility.append(
            f"- `{pin.module.name}` ({module.version}) against {len(same_major)} other {module.major}.x "
            f"releases: " + ("every shared name agrees (values, Python names, prototypes, struct layouts, "
                             "attribute types)" if not problems else f"{len(problems)} conflicts"))
        compatibility += [f"  - {version}: {text}" for version, text in problems]

    report = "\n".join([*lines, "", *compatibility, "", *steps]).rstrip()
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 1 if failed or conflicted else 0


if __name__ == "__main__":
    sys.exit(main())
