"""The two-call form of the bias-gradient epilogs (``_split_bgrad``) on the GPU: BGRADA / BGRADB as the plain
GEMM then A's row sums / B's column sums over K, against float64 references and the fused kernel, across
dtypes, layouts, batches, alpha, beta and C; recalled from a tuning database through ``matmul()`` (checked
and fast paths) and ``nvblaslt.torch.linear``'s bound backward step; chosen or not by ``autotune(search=True)``."""

from __future__ import annotations

import numpy as np
import pytest

import nvblaslt
from nvblaslt import Matmul, matmul
from nvblaslt import _function_form, _tuning_cache, _tuning_db
from tests.gpu.test_tuning_db_gpu import isolated  # noqa: F401 - autouse: a private cache, nothing loaded
from tests.reference import host, rel_error

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TOL = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 3e-2, "float64": 1e-12}
RNG = np.random.default_rng()
M, N, K, B = 72, 56, 200, 3


def rand(shape, dtype, layout="row"):
    """A fresh random tensor of logical ``shape``, stored row- or column-major."""
    stored = shape if layout == "row" else (*shape[:-2], shape[-1], shape[-2])
    t = torch.from_numpy(RNG.standard_normal(stored)).to(getattr(torch, dtype)).cuda()
    return t if layout == "row" else t.transpose(-1, -2)


def sums_reference(epilog: str, a, b) -> np.ndarray:
    """cuBLASLt's bias gradient of the inputs as given (alpha does not scale it), shaped as nvblaslt returns it."""
    summed = host(a).sum(axis=-1) if epilog == "BGRADA" else host(b).sum(axis=-2)
    return summed[..., None] if summed.ndim > 1 else summed


def check(got, expected, dtype: str, what: str) -> None:
    got = host(got)
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    assert not np.isnan(got).any(), f"{what}: NaN"
    error = rel_error(got, expected)
    assert error < TOL[dtype], f"{what}: relative error {error:.2e} (tolerance {TOL[dtype]})"


def database_with(tmp_path, plan, entry: dict):
    """A tuning database holding ``entry`` for ``plan``'s problem, loaded."""
    description = _tuning_cache.problem_description(plan._launch)
    fingerprint = _tuning_db.fingerprint_of(description["gpu"], description["cublaslt"], _tuning_db._driver())
    path = tmp_path / "split.jsonl"
    _tuning_db.TuningDatabase(fingerprint, {_tuning_cache.key_of(plan._launch): entry}).write(path)
    nvblaslt.load_tuning(path)
    return path


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "alpha-beta-c"])
@pytest.mark.parametrize("batched", [False, True], ids=["2d", "batched"])
@pytest.mark.parametrize("other_layout", ["row", "col"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("epilog", ["BGRADA", "BGRADB"])
def test_the_split_input_sums_match_float64_and_the_fused_kernel(epilog, dtype, other_layout, batched, scaled):
    """The summed operand in the layout cuBLASLt 13.1 has fused kernels for (BGRADA: a column-major A; BGRADB:
    a row-major B), the other in either; C column-major (the bias-gradient epilogs write a column-major D).
    BGRADB with a row-major A and no C has no split form: the plain GEMM would write D row-major."""
    batch = (B,) if batched else ()
    a_layout, b_layout = ("col", other_layout) if epilog == "BGRADA" else (other_layout, "row")
    a, b = rand((*batch, M, K), dtype, a_layout), rand((*batch, K, N), dtype, b_layout)
    c = rand((*batch, M, N), dtype, "col") if scaled else None
    alpha, beta = (0.5, 0.25) if scaled else (None, None)
    with Matmul(a, b, c, alpha=alpha, beta=beta) as mm:
        try:
            mm.plan(epilog=epilog)
        except (nvblaslt.CublasLtError, nvblaslt.NvblasltUnsupportedError) as error:
            pytest.skip(f"cuBLASLt runs no fused {epilog} here: {error}")
        d_fused, out_fused = mm.execute()
        if epilog == "BGRADB" and other_layout == "row" and not scaled:
            assert not mm._splittable()
            check(d_fused, host(a) @ host(b), dtype, "fused D")
            check(out_fused["bgradb"], sums_reference(epilog, a, b), dtype, "fused bgradb")
            return
        assert mm._splittable()
        mm._split_form = mm._make_split_form(iterations=0)
        d_split, out_split = mm.execute()
        torch.cuda.synchronize()
        d_ref = (alpha or 1.0) * (host(a) @ host(b)) + ((beta * host(c)) if scaled else 0.0)
        key = epilog.lower()
        for name, d, out in (("fused", d_fused, out_fused), ("split", d_split, out_split)):
            check(d, d_ref, dtype, f"{name} D")
            check(out[key], sums_reference(epilog, a, b), dtype, f"{name} {key}")
        assert tuple(out_split[key].shape) == tuple(out_fused[key].shape)
        assert out_split[key].stride() == out_fused[key].stride()
        assert d_split.stride() == d_fused.stride()  # the first call writes D where the fused kernel does
        y = torch.empty_strided(d_fused.shape, d_fused.stride(), dtype=d_fused.dtype, device="cuda")
        _, out_y = mm.execute(out=y)  # an out= laid out as the fused plan's D is the split form's too
        torch.cuda.synchronize()
        check(y, d_ref, dtype, "split D into out=")
        check(out_y[key], sums_reference(epilog, a, b), dtype, f"split {key} beside out=")
        # new operands of the same layouts: the GEMV reads them where the GEMM does
        a2, b2 = rand((*batch, M, K), dtype, a_layout), rand((*batch, K, N), dtype, b_layout)
        mm.reset_operands(a2, b2)
        d2, out2 = mm.execute()
        torch.cuda.synchronize()
        check(d2, (alpha or 1.0) * (host(a2) @ host(b2)) + ((beta * host(c)) if scaled else 0.0), dtype, "reset D")
        check(out2[key], sums_reference(epilog, a2, b2), dtype, f"reset {key}")


def test_a_broadcast_summed_operand_has_no_split_form():
    """The GEMV would sum a 2-D operand once, where the fused kernel writes one bias gradient per batch."""
    a, b = rand((B, M, K), "float16"), rand((K, N), "float16")  # BGRADB has kernels for a row-major B
    with Matmul(a, b) as mm:
        mm.plan(epilog="BGRADB")
        assert not mm._splittable()
        _, out = mm.execute()
        check(out["bgradb"], np.broadcast_to(host(b).sum(axis=0)[:, None], (B, N, 1)), "float16", "fused bgradb")
    with Matmul(rand((M, K), "float16", "col"), rand((B, K, N), "float16")) as mm:  # BGRADA: a column-major A
        mm.plan(epilog="BGRADA")
        assert not mm._splittable()
    with Matmul(rand((B, M, K), "float16", "col"), rand((B, K, N), "float16")) as mm:
        mm.plan(epilog="BGRADA")
        assert mm._splittable()


def test_host_operands_run_the_split_form_and_take_a_reset():
    """NumPy operands: the plans read their device copies; D comes back laid out as the fused plan's, and
    reset_operands refreshes the copies the first call reads."""
    a, b = np.asfortranarray(RNG.standard_normal((M, K))), RNG.standard_normal((K, N))
    with Matmul(a.astype(np.float32), b.astype(np.float32)) as mm:
        mm.plan(epilog="BGRADB")
        mm._split_form = mm._make_split_form(iterations=0)
        assert mm._split_form is not None
        for _ in range(2):
            d, out = mm.execute()
            check(d, a @ b, "float32", "D")
            check(out["bgradb"], b.sum(axis=0), "float32", "bgradb")
            a, b = np.asfortranarray(RNG.standard_normal((M, K))), RNG.standard_normal((K, N))
            mm.reset_operands(a.astype(np.float32), b.astype(np.float32))


def test_a_database_in_the_split_form_is_recalled_by_matmul_on_every_path(tmp_path):
    """A = xᵀ (column-major), as a weight gradient's GEMM has it: the plain GEMM writes D where BGRADB does."""
    a, b = rand((M, K), "bfloat16", "col"), rand((K, N), "bfloat16")
    with Matmul(a, b) as mm:
        mm.plan(epilog="BGRADB")
        database_with(tmp_path, mm, {"kind": "default", "bias_gradient_form": "split", "form_ratio": 0.95})
    _function_form.clear_plan_cache()
    for _ in range(3):  # planned (recalled), the checked path's cache hit, then the fast path
        a, b = rand((M, K), "bfloat16", "col"), rand((K, N), "bfloat16")
        d, out = matmul(a, b, epilog="BGRADB")
        torch.cuda.synchronize()
        check(d, host(a) @ host(b), "bfloat16", "D")
        check(out["bgradb"], host(b).sum(axis=0), "bfloat16", "bgradb")
    plans = [p for p in _function_form._local.plans.values() if p._epilog.name == "BGRADB"]
    assert plans and all(p._split_form is not None for p in plans)
    # a row-major A: a problem of its own, with no split form whatever a database says; the fused kernel runs
    a, b = rand((M, K), "bfloat16"), rand((K, N), "bfloat16")
    with Matmul(a, b) as mm:
        mm.plan(epilog="BGRADB")
        database_with(tmp_path, mm, {"kind": "default", "bias_gradient_form": "split", "form_ratio": 0.95})
    _function_form.clear_plan_cache()
    d, out = matmul(a, b, epilog="BGRADB")
    torch.cuda.synchronize()
    check(d, host(a) @ host(b), "bfloat16", "row-major A: D")
    check(out["bgradb"], host(b).sum(axis=0), "bfloat16", "row-major A: bgradb")
    assert tuple(d.stride()) == (1, M)  # BGRADB's column-major D
    assert all(p._split_form is None for p in _function_form._local.plans.values() if p._epilog.name == "BGRADB")


def test_linear_backward_recalls_the_split_form_a_database_chose(tmp_path, caplog):
    """linear()'s weight gradient with a bias runs BGRADB through matmul() (in autograd's thread): the plan
    recalls the split form, and dW and db are right."""
    from nvblaslt.torch import linear

    tokens, fan_in, fan_out = 96, 64, 80
    x, g = rand((tokens, fan_in), "bfloat16"), rand((tokens, fan_out), "bfloat16")
    with Matmul(x.T, g) as mm:  # the weight gradient's GEMM: dW = xᵀ dz, the bias gradient dz summed over T
        mm.plan(epilog="BGRADB")
        summary = _tuning_cache.problem_summary(_tuning_cache.problem_description(mm._launch), mm._launch.lib.api)
        database_with(tmp_path, mm, {"kind": "default", "bias_gradient_form": "split"})
    caplog.set_level("DEBUG", logger="nvblaslt")
    for _ in range(2):  # planned, then the plan cached
        x, g = rand((tokens, fan_in), "bfloat16"), rand((tokens, fan_out), "bfloat16")
        w = rand((fan_out, fan_in), "bfloat16").requires_grad_(True)
        bias = rand((fan_out,), "bfloat16").requires_grad_(True)
        linear(x, w, bias).backward(g)
        torch.cuda.synchronize()
        check(w.grad, host(g).T @ host(x), "bfloat16", "dW")
        check(bias.grad, host(g).sum(axis=0), "bfloat16", "db")
    assert any("split bias-gradient form" in r.getMessage() and summary in r.getMessage() for r in caplog.records)


def test_a_pointwise_convs_bound_backward_step_runs_the_split_form(tmp_path):
    """FusedConv2d's 1×1 backward binds dW = dzᵀ x with BGRADB for db once (``_pointwise``): in the split form
    a database chose, the bound step launches the plain GEMM and the GEMV on each call's pointers."""
    from nvblaslt.torch import _bound
    from nvblaslt.torch._conv import FusedConv2d

    n, c, o, h, w = 2, 48, 40, 6, 8
    rows = n * h * w
    conv = torch.nn.Conv2d(c, o, 1, device="cuda", dtype=torch.bfloat16)
    fused = FusedConv2d.from_conv(conv, "none")
    x_rows, dz_rows = rand((rows, c), "bfloat16"), rand((rows, o), "bfloat16")
    with Matmul(x_rows.T, dz_rows) as mm:
        mm.plan(epilog="BGRADB")
        database_with(tmp_path, mm, {"kind": "default", "bias_gradient_form": "split"})
    for _ in range(2):  # the step's backward GEMM bound, then launched again on new pointers
        fused.zero_grad()
        x = rand((n, c, h, w), "bfloat16").contiguous(memory_format=torch.channels_last)
        g = rand((n, o, h, w), "bfloat16").contiguous(memory_format=torch.channels_last)
        fused(x).backward(g)
        torch.cuda.synchronize()
        x2 = host(x.permute(0, 2, 3, 1).reshape(rows, c))
        g2 = host(g.permute(0, 2, 3, 1).reshape(rows, o))
        check(fused.weight.grad.reshape(o, c), g2.T @ x2, "bfloat16", "dW")
        check(fused.bias.grad, g2.sum(axis=0), "bfloat16", "db")
    steps = [entry[0] for entry in _bound._local.entries.values()]
    assert any(isinstance(step.gemms[2], _bound.BoundSplitGemm) for step in steps if hasattr(step, "gemms"))


@pytest.mark.parametrize("epilog", ["BGRADA", "BGRADB"])
def test_autotune_search_picks_fused_or_split_input_sums_and_both_are_right(epilog):
    a = rand((2, 256, 1024), "float16", "col")  # BGRADA's fused kernels take a column-major A; for BGRADB it
    b = rand((2, 1024, 384), "float16")  # makes the plain GEMM write D where the fused kernel does
    key = epilog.lower()
    with Matmul(a, b) as mm:
        mm.plan(epilog=epilog)
        mm.autotune(iterations=2, search=True, remember=False)
        form, form_ms, other_ms = mm.bias_gradient_form
        assert form in ("fused", "split") and form_ms > 0 and other_ms > 0
        assert (mm._split_form is not None) == (form == "split")
        d, out = mm.execute()
        torch.cuda.synchronize()
        check(d, host(a) @ host(b), "float16", "D")
        check(out[key], sums_reference(epilog, a, b), "float16", key)
    if epilog == "BGRADB":  # a row-major A: no split form to choose, so the search reports none
        with Matmul(rand((2, 256, 1024), "float16"), b) as mm:
            mm.plan(epilog=epilog)
            mm.autotune(iterations=2, search=True, remember=False)
            assert mm.bias_gradient_form is None and mm._split_form is None
