"""What pyproject.toml promises: one version, true dependency bounds, the console script.
(.ci/run builds the wheel and sdist and checks their contents.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(*extras: str) -> list[str]:
    optional = PROJECT["project"]["optional-dependencies"]
    return [*PROJECT["project"]["dependencies"], *(r for e in extras for r in optional[e])]


def test_version_is_written_once():
    assert PROJECT["project"]["dynamic"] == ["version"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "nvblaslt._version.__version__"}
    written = [p.name for p in (ROOT / "nvblaslt").glob("*.py") if re.search(r"^__version__\s*=", p.read_text(), re.M)]
    assert written == ["_version.py"]

    import nvblaslt
    from nvblaslt import _version

    assert nvblaslt.__version__ == _version.__version__


def test_every_requirement_has_the_lower_bound_ci_installs():
    # .ci/run's lowest-versions step installs exactly these bounds
    for requirement in _requirements("cu12", "cu13", "codegen", "test", "typecheck"):
        assert ">=" in requirement, f"{requirement}: no lower bound"


def test_each_cuda_extra_keeps_cuda_bindings_to_what_its_driver_runs():
    cu12, cu13 = (PROJECT["project"]["optional-dependencies"][e] for e in ("cu12", "cu13"))
    assert any(r.startswith("cuda-bindings") and "<13" in r for r in cu12)
    assert any(r.startswith("nvidia-cublas-cu12") and "<13" in r for r in cu12)
    assert any(r.startswith("nvidia-cublas>=") and "<14" in r for r in cu13)


def test_numpy_is_not_a_runtime_dependency():
    assert not any(r.startswith("numpy") for r in PROJECT["project"]["dependencies"])


def test_console_script_runs_the_module_cli():
    assert PROJECT["project"]["scripts"] == {"nvblaslt": "nvblaslt.__main__:main"}
    out = subprocess.run([sys.executable, "-m", "nvblaslt", "--help"], capture_output=True, text=True, check=True)
    assert "usage: nvblaslt" in out.stdout and "info" in out.stdout and "bench" in out.stdout


def test_changelog_has_an_unreleased_section_and_one_for_this_version():
    import nvblaslt

    headings = re.findall(r"^## \[([^\]]+)\](.*)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings and headings[0][0] == "Unreleased", "CHANGELOG.md: the first section is [Unreleased]"
    versions = {name: rest for name, rest in headings[1:]}
    assert nvblaslt.__version__ in versions, f"CHANGELOG.md: no section for {nvblaslt.__version__}"
    assert all(re.fullmatch(r" - \d{4}-\d\d-\d\d", rest) for rest in versions.values()), \
        "CHANGELOG.md: each release heading is `## [X.Y.Z] - YYYY-MM-DD`"


def test_python_classifiers_run_from_the_lowest_supported_version_without_gaps():
    lowest = re.fullmatch(r">=3\.(\d+)", PROJECT["project"]["requires-python"])
    assert lowest, "requires-python is `>=3.N`"
    minors = sorted(int(c.rsplit(".", 1)[1]) for c in PROJECT["project"]["classifiers"]
                    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert minors == list(range(int(lowest.group(1)), minors[-1] + 1)), minors


def test_the_docs_extra_has_numpy_and_no_torch():
    docs = PROJECT["project"]["optional-dependencies"]["docs"]
    assert any(r.startswith("numpy") for r in docs), "the doctests pass NumPy arrays"
    assert not any(r.startswith(("torch", "jax")) for r in docs), "the docs build must not pull a CUDA build of torch"


def test_authors_are_named():
    assert all(author.get("name") for author in PROJECT["project"]["authors"])


def test_the_sdist_carries_the_files_the_readme_links():
    manifest = (ROOT / "MANIFEST.in").read_text().split()
    always = {"README.md", "LICENSE", "pyproject.toml"}  # setuptools puts these in every sdist
    top_level = {link.split("/")[0].split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
                 if "://" not in link}
    missing = sorted(name for name in top_level - always if name not in manifest)
    assert not missing, f"MANIFEST.in: README.md links these, which the sdist would lack: {missing}"
