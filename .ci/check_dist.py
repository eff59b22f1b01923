"""Check the built distributions: a pure-Python wheel with the license and the console script,
without the generator or the tests; an sdist holding everything its tests need.

    python .ci/check_dist.py DIST_DIR
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

# What the sdist's test suite reads besides the package itself.
SDIST_NEEDS = ["LICENSE", "pyproject.toml", "README.md", "tests/__init__.py", "tests/conftest.py", "tests/fakes.py",
               "tests/reference.py", "tests/scripts.py", "tests/cpu/__init__.py", "tests/gpu/__init__.py",
               "codegen/templates/bindings.py.j2", "headers/stubs/stdint.h", "headers/pins/cuda12.json",
               "headers/pins/cuda13.json", "examples/regenerate_bindings.py", "nvblaslt/py.typed",
               "CHANGELOG.md", "CONTRIBUTING.md", "tools/nvmath_suite.py", "docs/guide/migrating.md"]


def check_wheel(path: Path) -> list[str]:
    problems = []
    if not path.name.endswith("-py3-none-any.whl"):
        problems.append(f"{path.name}: not a py3-none-any wheel")
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        entry_points = next((wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        problems.append("wheel: no LICENSE under .dist-info/licenses")
    if "nvblaslt = nvblaslt.__main__:main" not in entry_points:
        problems.append("wheel: no `nvblaslt` console script")
    strays = sorted({n.split("/")[0] for n in names} - {"nvblaslt", path.name.split("-")[0] + "-" +
                                                        path.name.split("-")[1] + ".dist-info"})
    if strays:
        problems.append(f"wheel: top-level entries besides the package: {strays}")
    if not any(n.endswith("_generated/cublaslt_13.py") for n in names):
        problems.append("wheel: no generated bindings")
    return problems


def check_sdist(path: Path) -> list[str]:
    with tarfile.open(path) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    return [f"sdist: no {need}" for need in SDIST_NEEDS if need not in names]


def main(dist: Path) -> int:
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        print(f"expected one wheel and one sdist in {dist}, found {[p.name for p in (*wheels, *sdists)]}")
        return 1
    problems = check_wheel(wheels[0]) + check_sdist(sdists[0])
    for problem in problems:
        print(f"FAIL {problem}")
    if not problems:
        print(f"ok   {wheels[0].name}: pure Python, LICENSE, console script; {sdists[0].name}: tests runnable")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
