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
