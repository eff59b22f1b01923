"""The public surface as a type checker sees it: mypy run on users' snippets (skipped without mypy;
CI's type-check step installs it and runs these). Each check also states what must be refused, so
that a surface typed ``Any`` fails here."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nvblaslt._epilogs import SPECS, MatmulEpilog

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / ".ci"


def mypy(*arguments: str) -> tuple[int, str]:
    """mypy as CI runs it: from the repository root (its configuration and cache), imports followed
    silently (errors in nvblaslt's own modules are the package check's business)."""
    done = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary",
                           "--hide-error-context", *arguments], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    return done.returncode, done.stdout + done.stderr


def check(tmp_path: Path, source: str, *flags: str) -> tuple[int, list[str]]:
    """mypy's errors on ``source`` as (line, error) pairs, the line numbered from the snippet's first."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(source))
    code, output = mypy(*flags, str(snippet))
    errors = [(int(m[1]), m[2]) for m in re.finditer(r"^.*snippet\.py:(\d+): error: (.*)$", output, re.M)]
    assert code == (1 if errors else 0), output  # 2: mypy itself failed (a crash, a bad flag)
    return code, errors


@pytest.mark.parametrize(("snippet", "flags"), [("typed_snippet.py", ["--strict"]), ("typed_snippet_plain.py", [])])
def test_ci_snippets(snippet, flags):
    pytest.importorskip("torch")  # the snippets are PyTorch users' code
    code, output = mypy(*flags, str(SNIPPETS / snippet))
    assert code == 0, output


def test_matmul_is_typed_by_what_the_epilog_returns(tmp_path):
    """Every epilog, by member and by name in both cases, against the rules' own table (SPECS)."""
    lines = ["from typing_extensions import assert_type", "from nvblaslt import MatmulEpilog, matmul", "",
             "class Array: ...", "a, b = Array(), Array()", "Either = Array | tuple[Array, dict[str, Array]]"]
    for epilog, spec in SPECS.items():
        expected = "tuple[Array, dict[str, Array]]" if spec.outputs else "Array"
        for spelling in (f"MatmulEpilog.{epilog.name}", repr(epilog.name), repr(epilog.name.lower())):
            lines.append(f"assert_type(matmul(a, b, epilog={spelling}), {expected})")
        # known only at run time: either form
        lines.append(f"assert_type(matmul(a, b, epilog={epilog.name.capitalize()!r}), Either)")
        lines.append(f"assert_type(matmul(a, b, epilog={int(epilog)}), Either)")
    lines += ["assert_type(matmul(a, b), Array)", "assert_type(matmul(a, b, epilog=None), Array)",
              "def given(epilog: MatmulEpilog) -> None:", "    assert_type(matmul(a, b, epilog=epilog), Either)"]
    assert len(SPECS) == len(MatmulEpilog) == 16
    assert check(tmp_path, "\n".join(lines) + "\n") == (0, [])


def test_the_results_are_checked_not_any(tmp_path):
    code, errors = check(tmp_path, """\
        import ctypes
        from nvblaslt import Matmul, lt, matmul

        class Array: ...
        a = Array()
        wrong: str = matmul(a, a)
        y, aux = matmul(a, a, epilog="RELU_AUX")
        wrong_aux: str = aux["relu_aux"]
        plan: Matmul[Array] = Matmul(a, a)
        wrong_result: str = plan.execute()
        lt.cublasLtMatmulDescCreat(None, 0, 0)
        lt.cublasLtMatmulDescCreate(3, lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)
        wrong_status: str = lt.cublasLtMatmulDescDestroy(lt.cublasLtMatmulDesc_t())
        lt.cublasLtLoggerSetCallback(None)
        status: int = lt.cublasLtMatmulDescCreate(ctypes.byref(lt.cublasLtMatmulDesc_t()), 0, lt.CUDA_R_32F)
        fine: Array = matmul(a, a, epilog="bias")
    """, "--strict")
    assert [line for line, _ in errors] == [6, 8, 10, 11, 12, 13, 14], errors
    assert "[assignment]" in errors[0][1] and "[attr-defined]" in errors[3][1] and "[arg-type]" in errors[4][1]


def test_an_unannotated_plan_executes_to_any(tmp_path):
    """The epilog is known at plan() time, not at construction: execute() is Any unless annotated."""
    assert check(tmp_path, """\
        from typing import Any
        from typing_extensions import assert_type
        from nvblaslt import Matmul

        class Array: ...
        with Matmul(Array(), Array()) as plan:
            assert_type(plan.execute(), Any)
            plan.execute().sum()
        with Matmul[tuple[Array, dict[str, Array]]](Array(), Array()) as typed:
            assert_type(typed.execute()[1], dict[str, Array])

        def given(plan: Matmul) -> None:  # a bare Matmul is Matmul[Any], also under --strict
            assert_type(plan.execute(), Any)
    """, "--strict") == (0, [])
