"""Print pip constraints for a CI step.

    python .ci/constraints.py pinned              the wheels headers/pins names (what the bindings come from)
    python .ci/constraints.py lowest EXTRA ...    every declared lower bound of pyproject.toml

``lowest`` covers the build requirements, the dependencies and the named extras. Where a name
is bounded twice (cuda-bindings in the dependencies and in an extra) the higher bound wins: it
is the lowest version that satisfies both.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _numeric(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def lower_bounds(requirements: list[str]) -> dict[str, str]:
    bounds: dict[str, str] = {}
    for requirement in requirements:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*([^;]*).*", requirement)
        if match is None:
            sys.exit(f"cannot read the requirement {requirement!r}")
        name, specifiers = match.groups()
        for low in re.findall(r">=\s*([0-9][0-9.]*)", specifiers):
            key = name.lower().replace("_", "-")
            if key not in bounds or _numeric(low) > _numeric(bounds[key]):
                bounds[key] = low
    return bounds


def lowest(extras: list[str]) -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    optional = project["project"]["optional-dependencies"]
    unknown = [e for e in extras if e not in optional]
    if unknown:
        sys.exit(f"no such extras: {unknown}; pyproject.toml has {sorted(optional)}")
    requirements = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    for extra in extras:
        requirements += optional[extra]
    return lower_bounds(requirements)


def pinned() -> dict[str, str]:
    wheels: dict[str, str] = {}
    for pin in sorted((ROOT / "headers" / "pins").glob("*.json")):
        wheels.update(json.loads(pin.read_text())["wheels"])
    return wheels


def main(argv: list[str]) -> int:
    if argv[:1] == ["pinned"] and len(argv) == 1:
        versions = pinned()
    elif argv[:1] == ["lowest"]:
        versions = lowest(argv[1:])
    else:
        sys.exit(__doc__)
    for name, version in sorted(versions.items()):
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
