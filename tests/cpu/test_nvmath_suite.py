"""tools/nvmath_suite.py without a GPU: its arguments, the git checkout at a tag (from a local repository),
the import swap on a fake nvmath-python and a fake test file, the error mapping, and `compare` on the
published runs."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "nvmath_suite.py"
sys.path.insert(0, str(TOOL.parent))
import nvmath_suite  # noqa: E402

FAKE_NVMATH = {
    "nvmath/__init__.py": "from . import bindings, linalg\n__version__ = '0.0.fake'\n",
    "nvmath/linalg/__init__.py": "from . import advanced\n",
    "nvmath/linalg/advanced/__init__.py": textwrap.dedent("""\
        def matmul(a, b, /, c=None, **kwargs):
            return "nvmath"
        class Matmul:
            pass
        class MatmulEpilog:
            pass
        MatmulOptions = MatmulPlanPreferences = MatmulEpilogPreferences = MatmulQuantizationScales = dict
        matrix_qualifiers_dtype = None
        """),
    "nvmath/bindings/__init__.py": "from . import cublasLt\n",
    "nvmath/bindings/cublasLt.py": textwrap.dedent("""\
        class cuBLASLtError(Exception):
            def __init__(self, status):
                self.status = status
                super().__init__(f"fake ({status})")
        """),
}

# What a test module of nvmath-python's does: import the public names at import time, use the package's
# attribute at run time, and compute references through the fp8 helper.
FAKE_TESTS = {
    "conftest.py": "",
    "nvmath_tests/__init__.py": "",
    "nvmath_tests/linalg/__init__.py": "",
    "nvmath_tests/linalg/advanced/__init__.py": "",
    "nvmath_tests/linalg/advanced/matmul/__init__.py": "",
    "nvmath_tests/linalg/advanced/matmul/fp8_utils.py": "from nvmath.linalg.advanced import matmul\n",
    "nvmath_tests/linalg/advanced/matmul/test_fake.py": textwrap.dedent("""\
        import nvmath
        from nvmath.linalg.advanced import Matmul, matmul
        from . import fp8_utils

        def test_imported_name_is_nvblaslts():
            assert matmul.__module__.startswith("nvblaslt")

        def test_package_attribute_is_nvblaslts():
            assert issubclass(nvmath.linalg.advanced.Matmul, Matmul) and Matmul.__module__.startswith("nvblaslt")

        def test_reference_helper_stays_nvmaths():
            assert fp8_utils.matmul(1, 2) == "nvmath"

        def test_raises():
            raise KeyError("a failure's class is recorded")
        """),
}


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def fake(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """(the fetched checkout, the environment with the fake nvmath-python importable)"""
    site = write(tmp_path / "site", FAKE_NVMATH)
    write(tmp_path / "checkout" / "tests", FAKE_TESTS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    return tmp_path / "checkout", env


def run_tool(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


def test_arguments():
    parser = nvmath_suite.parser()
    args = parser.parse_args(["run", "--target", "nvblaslt", "--files", "test_a.py, test_b.py", "--", "-k", "x"])
    assert (args.target, args.dir, args.raw_errors) == ("nvblaslt", nvmath_suite.DIRECTORY, False)
    assert args.pytest_args == ["--", "-k", "x"]
    assert parser.parse_args(["fetch"]).tag == nvmath_suite.TAG
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--target", "cublas"])
    with pytest.raises(SystemExit):
        parser.parse_args(["run"])  # --target is required


def test_run_without_a_checkout_says_what_to_do(tmp_path: Path):
    result = run_tool("run", "--target", "nvmath", "--dir", str(tmp_path / "none"))
    assert result.returncode == 2
    assert "--dir" in result.stderr and "fetch" in result.stderr


def test_the_swap_reaches_imported_names_and_the_package_but_not_the_reference(fake, tmp_path: Path):
    checkout, env = fake
    outcomes = {}
    for target in nvmath_suite.TARGETS:
        out = tmp_path / f"{target}.json"
        result = run_tool("run", "--target", target, "--dir", str(checkout), "--files", "test_fake.py",
                          "--out", str(out), "--", "-q", env=env)
        assert result.returncode == 1, result.stdout + result.stderr  # test_raises fails on both
        data = json.loads(out.read_text())
        assert data["target"] == target
        outcomes[target] = {nodeid.rsplit("::", 1)[1]: entry for nodeid, entry in data["tests"].items()}
    assert {name: e["outcome"] for name, e in outcomes["nvblaslt"].items()} == {
        "test_imported_name_is_nvblaslts": "passed", "test_package_attribute_is_nvblaslts": "passed",
        "test_reference_helper_stays_nvmaths": "passed", "test_raises": "failed"}
    assert {name: e["outcome"] for name, e in outcomes["nvmath"].items()} == {
        "test_imported_name_is_nvblaslts": "failed", "test_package_attribute_is_nvblaslts": "failed",
        "test_reference_helper_stays_nvmaths": "passed", "test_raises": "failed"}
    assert outcomes["nvblaslt"]["test_raises"]["type"] == "KeyError"
    assert outcomes["nvmath"]["test_imported_name_is_nvblaslts"]["type"] == "AssertionError"

    report = run_tool("compare", str(tmp_path / "nvblaslt.json"), str(tmp_path / "nvmath.json"))
    assert report.returncode == 1  # two tests that pass on nvblaslt fail on nvmath
    assert "of 3 tests passed on the base, the candidate passes 1" in report.stdout
    assert "2 failed AssertionError" in report.stdout


def test_cublas_errors_surface_as_nvmaths_class(fake, monkeypatch):
    checkout, env = fake
    monkeypatch.syspath_prepend(env["PYTHONPATH"].split(os.pathsep)[0])
    for name in [m for m in sys.modules if m == "nvmath" or m.startswith("nvmath.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        check_error_mapping()
    finally:  # the fake nvmath-python must not outlive this test: others look for the real one
        for name in [m for m in sys.modules if m == "nvmath" or m.startswith("nvmath.")]:
            del sys.modules[name]


def check_error_mapping() -> None:
    import nvblaslt
    from nvmath.bindings.cublasLt import cuBLASLtError

    def refused():
        raise nvblaslt.CublasLtError("cublasLtMatmulAlgoGetHeuristic", 15, "CUBLAS_STATUS_NOT_SUPPORTED", "no")

    with pytest.raises(cuBLASLtError) as caught:
        nvmath_suite.raising_nvmath_errors(refused)()
    assert type(caught.value) is cuBLASLtError and caught.value.status == 15  # the tests compare with `is`
    assert isinstance(caught.value.__cause__, nvblaslt.CublasLtError)
    with pytest.raises(ValueError):  # other errors pass through as they are
        nvmath_suite.raising_nvmath_errors(lambda: int("x"))()
    swapped = nvmath_suite.replacements(raw_errors=False)
    assert issubclass(swapped["Matmul"], nvblaslt.Matmul) and swapped["MatmulEpilog"] is nvblaslt.MatmulEpilog
    assert nvmath_suite.replacements(raw_errors=True)["matmul"] is nvblaslt.matmul


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_fetch_checks_out_the_tests_folder_at_the_tag(tmp_path: Path):
    source = tmp_path / "source"
    write(source, {"LICENSE": "license\n", "nvmath/big.py": "x = 1\n", **{f"tests/{k}": v for k, v in FAKE_TESTS.items()}})
    git = ["git", "-C", str(source), "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "one"], ["tag", "v9.9.9"]):
        subprocess.run([*git, *command], check=True, capture_output=True)
    (source / "tests" / "conftest.py").write_text("# after the tag\n")
    subprocess.run([*git, "commit", "-q", "-am", "two"], check=True, capture_output=True)

    target = tmp_path / "suite"
    result = run_tool("fetch", "--tag", "v9.9.9", "--dir", str(target), "--repository", source.as_uri())
    assert result.returncode == 0, result.stderr
    assert (target / "tests" / nvmath_suite.MATMUL_TESTS / "test_fake.py").is_file()
    assert (target / "LICENSE").is_file() and not (target / "nvmath").exists()
    assert (target / "tests" / "conftest.py").read_text() == ""  # the tag's, not the later commit's
    again = run_tool("fetch", "--tag", "v9.9.9", "--dir", str(target), "--repository", source.as_uri())
    assert again.returncode == 2 and "--dir" in again.stderr


def test_compare_reads_the_published_runs(tmp_path: Path):
    paths = []
    for name in ("nvmath", "nvblaslt"):
        (published,) = (ROOT / "docs" / "peer-results").glob(f"{name}-*.json.gz")
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_bytes(gzip.decompress(published.read_bytes()))
    report = run_tool("compare", *map(str, paths), "--top", "3")
    assert report.returncode == 1
    assert "base (nvmath" in report.stdout and "18219 passed" in report.stdout  # docs/compatibility.md's table
    assert "of 18219 tests passed on the base, the candidate passes 18177" in report.stdout
