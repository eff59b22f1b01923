"""nvblaslt.torch.grouped_mm and GroupedLinear without a GPU: the op's math (torch matmuls off CUDA), its
fake implementation, and the autograd formula, whose every gradient is a grouped GEMM of another form
(checked by float64 gradcheck, so the same calls are right on CUDA, where they run on cuBLASLt)."""

import contextlib

import pytest

torch = pytest.importorskip("torch")

from nvblaslt.torch import GroupedLinear, grouped_mm  # noqa: E402

F64 = torch.float64
SIZES = [3, 0, 4, 2]  # an empty group included


def _operands(form, requires_grad=True):
    torch.manual_seed(len(form))
    g, m, n, k = len(SIZES), 3, 5, 4
    total = sum(SIZES)
    shapes = {"2d3d": ((total, k), (g, k, n)), "3d2d": ((g, m, k), (k, total)), "2d2d": ((m, total), (total, n)),
              "3d3d": ((g, m, k), (g, k, n))}[form]
    a = torch.randn(shapes[0], dtype=F64, requires_grad=requires_grad)
    b = torch.randn(shapes[1], dtype=F64, requires_grad=requires_grad)
    offs = None if form == "3d3d" else torch.tensor(SIZES, dtype=torch.int32).cumsum(0).to(torch.int32)
    return a, b, offs


def _loop(form, a, b, offs):
    if form == "3d3d":
        return a @ b
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    if form == "2d3d":
        return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip(starts, ends))])
    if form == "3d2d":
        return torch.cat([a[i] @ b[:, s:e] for i, (s, e) in enumerate(zip(starts, ends))], dim=1)
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])


@pytest.mark.parametrize("form", ["2d3d", "3d2d", "2d2d", "3d3d"])
def test_forward_is_each_groups_product(form):
    a, b, offs = _operands(form, requires_grad=False)
    torch.testing.assert_close(grouped_mm(a, b, offs), _loop(form, a, b, offs))


@pytest.mark.parametrize("form", ["2d3d", "3d2d", "2d2d", "3d3d"])
def test_gradients_are_grouped_gemms_of_the_other_forms(form):
    a, b, offs = _operands(form)
    assert torch.autograd.gradcheck(lambda a, b: grouped_mm(a, b, offs), (a, b))
    # and against the loop's own autograd, on transposed (column-major) views as well
    out = grouped_mm(a.transpose(-1, -2).contiguous().transpose(-1, -2), b, offs)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (a, b), grad)
    want = torch.autograd.grad(_loop(form, a, b, offs), (a, b), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("form", ["2d3d", "3d2d", "2d2d", "3d3d"])
def test_each_gradient_comes_in_its_inputs_memory_order(form):
    """The gradient of a tensor under a transposed view (the experts' weight, ``weight.transpose(1, 2)``)
    comes out contiguous, as the tensor is, so that ``backward()`` takes it as ``.grad`` without a
    transposing copy; and it is right, through the op's float64 gradcheck too."""
    a, b, offs = _operands(form)
    under_a = a.detach().transpose(-1, -2).contiguous().requires_grad_()  # a = under_a's transposed view
    under_b = b.detach().transpose(-1, -2).contiguous().requires_grad_()
    out = grouped_mm(under_a.transpose(-1, -2), under_b.transpose(-1, -2), offs)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (under_a, under_b), grad)
    want = torch.autograd.grad(_loop(form, under_a.transpose(-1, -2), under_b.transpose(-1, -2), offs),
                               (under_a, under_b), grad)
    for g, w in zip(got, want):
        assert g.is_contiguous(), f"a gradient of strides {g.stride()} for a contiguous tensor: autograd copies it"
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradcheck(lambda x, w: grouped_mm(x.transpose(-1, -2), w.transpose(-1, -2), offs),
                                    (under_a, under_b))
    layer = GroupedLinear(len(SIZES), 4, 5, dtype=F64)  # its weight (G, N, K) enters as a transposed view
    x = torch.randn(sum(SIZES), 4, dtype=F64)
    layer(x, torch.tensor(SIZES, dtype=torch.int32).cumsum(0).to(torch.int32)).sum().backward()
    assert layer.weight.grad.is_contiguous()


def test_the_op_passes_torchs_opcheck():
    a, b, offs = _operands("2d3d")
    torch.library.opcheck(torch.ops.nvblaslt.grouped_mm.default, (a, b, offs, None))


def test_under_torch_compile_fullgraph():
    a, b, offs = _operands("2d3d", requires_grad=False)
    compiled = torch.compile(lambda a, b, offs: grouped_mm(a, b, offs) * 2, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(a, b, offs), 2 * _loop("2d3d", a, b, offs))


def test_grouped_linear_is_a_linear_per_expert_and_trains():
    torch.manual_seed(0)
    experts = GroupedLinear(4, 6, 8, dtype=F64)
    assert experts.weight.shape == (4, 8, 6)
    bound = 1 / 6 ** 0.5  # nn.Linear's init bound for 6 inputs
    assert experts.weight.abs().max() <= bound and experts.weight.std() > bound / 4
    x = torch.randn(9, 6, dtype=F64, requires_grad=True)
    offs = torch.tensor([2, 2, 6, 9], dtype=torch.int32)
    out = experts(x, offs)
    want = torch.cat([x[0:2] @ experts.weight[0].T, x[2:6] @ experts.weight[2].T, x[6:9] @ experts.weight[3].T])
    torch.testing.assert_close(out, want)
    out.square().sum().backward()
    assert experts.weight.grad is not None and experts.weight.grad[1].abs().max() == 0  # no token for expert 1
    assert "groups=4, in_features=6, out_features=8" in repr(experts)


@pytest.mark.parametrize("skewed", [False, True])
def test_the_grouped_bench_splits_every_token_and_skews_with_empty_experts(skewed):
    from nvblaslt.bench.grouped import split

    sizes = split(torch, 8192, 128, skewed, seed=3)
    assert int(sizes.sum()) == 8192 and bool((sizes >= 0).all())
    assert (int((sizes == 0).sum()) >= 16) if skewed else int(sizes.max() - sizes.min()) <= 8192 % 128 + 0


def test_operands_whose_groups_are_not_matrices_are_copied_for_cublaslt():
    from nvblaslt.torch._grouped import _per_group_matrices

    expanded = torch.ones(()).expand(6, 8)                  # what out.sum().backward() hands the backward
    assert _per_group_matrices(expanded).stride() == (8, 1)
    # a ragged last extent is copied column-major: along memory it would need every group on 16 bytes
    assert _per_group_matrices(expanded, ragged=1).stride() == (1, 8)  # padded as a result is: never stride 1
    assert _per_group_matrices(expanded, ragged=0).stride() == (8, 1)
    weights = torch.randn(3, 8, 4)
    assert _per_group_matrices(weights.transpose(1, 2)).data_ptr() == weights.data_ptr()  # column-major: as it is
    strided = torch.randn(6, 16)[:, ::2]
    assert _per_group_matrices(strided).is_contiguous()


def test_the_moe_example_runs_its_checks_with_torch_matmuls():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "examples" / "moe_experts.py"), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in ("grouped GEMMs on cpu (torch matmuls), torch.float64", "input gradient: max error",
                 "the empty expert's weight gradients are zero: True", "all checks passed: True"):
        assert line in done.stdout, done.stdout
    assert ": False" not in done.stdout


def test_the_fake_gives_cuda_results_the_real_ops_padded_strides():
    # cuBLASLt's result rows start on 16 bytes; torch.compile must be told the strides the op returns
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nvblaslt._grouped_problem import padded_strides

    with FakeTensorMode():
        a = torch.empty(10, 16, device="cuda", dtype=torch.bfloat16)
        b = torch.empty(2, 16, 7, device="cuda", dtype=torch.bfloat16)
        offs = torch.empty(2, device="cuda", dtype=torch.int32)
        out = torch.ops.nvblaslt.grouped_mm(a, b, offs, None)
        wide = torch.ops.nvblaslt.grouped_mm(a, b, offs, torch.float32)
        cpu = torch.ops.nvblaslt.grouped_mm(a.cpu(), b.cpu(), offs.cpu(), None)
    assert out.shape == (10, 7) and out.stride() == (8, 1) == padded_strides((10, 7), 2)
    assert wide.dtype == torch.float32 and wide.stride() == (8, 1)   # 4-byte elements: 4 per 16 bytes
    assert cpu.stride() == (7, 1)                                      # torch matmuls off CUDA: contiguous


def test_unscaled_fp8_on_cuda_is_refused_by_name_and_pointed_at_the_scaled_call():
    """fp8 CUDA operands have no unscaled grouped GEMM (torch's matmuls refuse them as well): the op and its
    fake say so and name nvblaslt.grouped_matmul's scales; fp8 off CUDA runs as torch matmuls."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nvblaslt import NvblasltTypeError

    with FakeTensorMode():
        a = torch.empty(10, 16, device="cuda", dtype=torch.float8_e4m3fn)
        b = torch.empty(2, 16, 8, device="cuda", dtype=torch.float8_e4m3fn)
        offs = torch.empty(2, device="cuda", dtype=torch.int32)
        with pytest.raises(NvblasltTypeError, match=r"a: torch.float8_e4m3fn operands on CUDA need their scales.*"
                                                    r"grouped_matmul\(a, b, offs, scale_a="):
            torch.ops.nvblaslt.grouped_mm(a, b, offs, torch.bfloat16)
        with pytest.raises(NvblasltTypeError, match="b: torch.float8_e5m2"):
            torch.ops.nvblaslt.grouped_mm(a.to(torch.bfloat16), b.to(torch.float8_e5m2), offs, None)
    x = torch.randn(10, 16).to(torch.float8_e4m3fn)
    w = torch.randn(2, 16, 8).to(torch.float8_e4m3fn)
    ends = torch.tensor([4, 10], dtype=torch.int32)
    torch.testing.assert_close(grouped_mm(x, w, ends, out_dtype=torch.float32),
                               torch.cat([x[:4].float() @ w[0].float(), x[4:].float() @ w[1].float()]))


def test_a_float32_result_of_bfloat16_operands_is_not_their_rounded_product_off_cuda():
    """As cuBLASLt writes it: computed in float32, not the bfloat16 product cast afterwards."""
    torch.manual_seed(3)
    x, w = torch.randn(10, 64, dtype=torch.bfloat16), torch.randn(2, 64, 8, dtype=torch.bfloat16)
    ends = torch.tensor([4, 10], dtype=torch.int32)
    want = torch.cat([x[:4].float() @ w[0].float(), x[4:].float() @ w[1].float()])
    got = grouped_mm(x, w, ends, out_dtype=torch.float32)
    assert (got - want).abs().max() < 1e-4 < (want.bfloat16().float() - want).abs().max()


def test_the_grouped_bench_train_section_checks_its_gradients_on_the_cpu():
    from nvblaslt.bench.grouped import Experts, train_case

    case = train_case(torch, Experts("tiny", 4, 16, 24), 64, True, 1, device="cpu", dtype=torch.float64)
    assert set(case["rows"]) >= {"torch mm loop", "nvblaslt.torch.grouped_mm"}
    assert case["errors"]["nvblaslt.torch.grouped_mm"] < 1e-12  # float64: the same gradients as the loop
    assert case["errors"]["nvblaslt.torch.grouped_mm, backward()"] < 1e-12  # and accumulated into .grad
    # torch's takes no float64: left out, said why
    assert set(case["refused"]) <= {"torch._grouped_mm", "torch._grouped_mm, backward()"}


def test_autotune_context_tunes_each_grouped_problem_once_and_then_runs_it(monkeypatch):
    """Inside ``nvblaslt.torch.autotune()``, the op's cuBLASLt path times the problem's algorithms
    (``GroupedMatmul.autotune(search=True)``, from up to 16 of the heuristics') before running it, once per
    problem and context; outside, it only runs. GroupedMatmul and grouped_matmul are stand-ins here."""
    import nvblaslt
    from nvblaslt.torch import _grouped, autotune

    calls = []

    class Plan:
        def __init__(self, a, b, offs, *, out_dtype=None):
            calls.append(("plan", tuple(a.shape), tuple(b.shape), out_dtype))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            calls.append(("free",))

        def plan(self, *, limit):
            calls.append(("heuristics", limit))

        def autotune(self, *, iterations, search, remember):
            calls.append(("autotune", iterations, search, remember))

    def run(a, b, offs, *, out_dtype):
        calls.append(("run", tuple(a.shape)))
        return torch.zeros(a.shape[0], b.shape[-1], dtype=out_dtype)

    monkeypatch.setattr(nvblaslt, "GroupedMatmul", Plan)
    monkeypatch.setattr(nvblaslt, "grouped_matmul", run)
    x, w = torch.randn(12, 8, dtype=torch.bfloat16), torch.randn(3, 8, 4, dtype=torch.bfloat16)
    offs = torch.tensor([4, 4, 12], dtype=torch.int32)
    _grouped._native(x, w, offs, torch.bfloat16)
    assert calls == [("run", (12, 8))]  # no context: nothing timed
    calls.clear()
    with autotune(iterations=2):
        _grouped._native(x, w, offs, torch.bfloat16)
        _grouped._native(x, w, offs, torch.bfloat16)              # the same problem: tuned once
        _grouped._native(x[:8], w, offs, torch.bfloat16)          # a new token count: the same problem still
        _grouped._native(x, w[:, :, :2], offs, torch.bfloat16)    # other experts' shape: another problem
    assert calls == [("plan", (12, 8), (3, 8, 4), torch.bfloat16), ("heuristics", 16), ("autotune", 2, True, True),
                     ("free",), ("run", (12, 8)), ("run", (12, 8)), ("run", (8, 8)),
                     ("plan", (12, 8), (3, 8, 2), torch.bfloat16), ("heuristics", 16), ("autotune", 2, True, True),
                     ("free",), ("run", (12, 8))]


def test_the_grouped_bench_breaks_a_steps_host_time_down():
    from nvblaslt.bench.grouped import Experts, _step, host_rows

    step = _step(torch, Experts("tiny", 4, 16, 24), 64, True, "cpu", torch.float64)
    host = host_rows(torch, step, rounds=2, calls=2)
    assert set(host) == {"nvblaslt.torch.grouped_mm, forward, no gradient", "step",  # torch's takes no float64
                         "nvblaslt.torch.grouped_mm, forward, under autograd", "step, backward in the calling thread"}
    assert all(us > 0 for us in host.values())


def test_only_transposed_views_take_the_transposed_gradient_and_the_tuning_key_keeps_alignment():
    """An expanded (zero-stride) operand is not a transposed view (the forward copies it, column-major only
    where its ragged extent is the last); and the ``autotune()`` context's key leaves out the token total
    but keeps what a new total can change: the leading dimension's alignment of a column-major operand,
    which the tuning cache keys on."""
    from nvblaslt.torch._grouped import _problem_key, _runs_column_major

    weights = torch.randn(4, 16, 32, dtype=torch.bfloat16)
    assert _runs_column_major(weights.transpose(1, 2), None) and not _runs_column_major(weights, None)
    expanded = torch.randn(16, dtype=torch.bfloat16)[:, None].expand(16, 32)
    assert not _runs_column_major(expanded, 0) and _runs_column_major(expanded, 1)
    b = weights.transpose(1, 2)

    memory = torch.empty(32 * 2048, dtype=torch.bfloat16)  # one pointer for every token total below

    def key(total, column_major):
        a = memory.as_strided((total, 32), (1, total) if column_major else (32, 1))
        return _problem_key(a, b, torch.zeros(4, dtype=torch.int32), torch.bfloat16)
    assert key(1024, False) == key(1001, False)  # row-major tokens: a new total is the same problem
    assert key(1024, True) != key(1001, True)  # column-major: its leading dimension (the total) aligns otherwise
    assert key(1024, True) == key(2048, True)


def _emulated_cublaslt(a, b, offs, *, out_dtype):
    """``grouped_matmul`` on the CPU, with cuBLASLt's alignment rule as the derive kernel applies it: where
    an operand's or the result's ragged extent runs along memory, a group that does not start on 16 bytes
    is emptied (its rows or columns of a 2-D result are left as they were: zero here)."""
    from nvblaslt.torch import _grouped

    from nvblaslt._grouped_problem import padded_strides

    exact = _grouped._reference(a, b, offs, out_dtype)
    out = exact.new_empty_strided(exact.shape, padded_strides(tuple(exact.shape), exact.element_size())).copy_(exact)
    ragged_a, ragged_b = _grouped._RAGGED_DIMS[(a.dim(), b.dim())]
    along_memory = [16 // t.element_size() for t, dim in ((a, ragged_a), (b, ragged_b))
                    if dim is not None and t.shape[dim] > 1 and t.stride(dim) == 1]
    if (a.dim(), b.dim()) in _grouped._OUT_RAGGED:
        dim = _grouped._OUT_RAGGED[(a.dim(), b.dim())]
        if out.shape[dim] > 1 and out.stride(dim) == 1:
            along_memory.append(16 // out.element_size())
    ends = offs.tolist()
    for g, start in enumerate([0, *ends[:-1]]):
        if any(start % step for step in along_memory):
            if a.dim() == 2 and b.dim() == 2:
                out[g] = 0
            elif a.dim() == 2:
                out[start:ends[g]] = 0
            else:
                out[:, start:ends[g]] = 0
    return out


# (form, a's and b's layouts, the result's dtype): every case whose forward needs no aligned offsets, or
# (3-D × 2-D, whose result's columns run along memory) only the float32 result's alignment
CASES = [("2d3d", a, b, None) for a, b in (("row", "row"), ("row", "transposed"), ("expanded", "row"),
                                            ("expanded", "expanded"))] + \
        [("2d2d", a, b, None) for a, b in (("transposed", "row"), ("expanded", "row"), ("transposed", "expanded"),
                                            ("expanded", "expanded"))] + \
        [("3d2d", "row", b, torch.float32) for b in ("transposed", "expanded")] + [("2d3d n=1", "row", "row", None)]


@pytest.mark.parametrize("form, a_kind, b_kind, out_dtype", CASES)
@pytest.mark.parametrize("upstream", ["random", "expanded"])
def test_no_gradient_asks_more_alignment_of_the_offsets_than_the_forward(form, a_kind, b_kind, out_dtype, upstream,
                                                                         monkeypatch):
    """On the cuBLASLt path (emulated, with its alignment rule), offsets that are fine for the forward are
    fine for both gradients: with an expanded upstream gradient (``out.sum().backward()``), expanded and
    transposed-view inputs, a float32 result, a one-wide result. Offsets 3, 3, 7, 9 start groups off 16
    bytes (bf16), or on 16 bytes of float32 only (4, 4, 8, 12) where the forward needs that."""
    import nvblaslt
    from nvblaslt.torch import _grouped

    monkeypatch.setattr(nvblaslt, "grouped_matmul", _emulated_cublaslt)

    def cublaslt_path(a, b, offs, out_dtype):  # as on CUDA, for these CPU tensors
        return _grouped._native(a, b, offs, out_dtype or a.dtype)
    monkeypatch.setattr(_grouped, "_grouped_mm_impl", cublaslt_path)  # the backward's calls (no grad recorded)
    monkeypatch.setattr(_grouped, "_GroupedMM", _grouped.autograd_function(
        "GroupedMM", cublaslt_path, _grouped._setup_context, _grouped._grouped_mm_autograd))
    bf16 = torch.bfloat16
    n = 1 if form.endswith("n=1") else 8
    form = form.split()[0]
    sizes = [4, 0, 4, 4] if form == "3d2d" else [3, 0, 4, 2]
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    total, groups, m, k = sum(sizes), len(sizes), 8, 16
    torch.manual_seed(0)
    shapes = {"2d3d": ((total, k), (groups, k, n)), "2d2d": ((m, total), (total, n)), "3d2d": ((groups, m, k), (k, total))}
    make = {"row": lambda shape: torch.randn(shape, dtype=bf16),
            "transposed": lambda shape: torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=bf16).transpose(-1, -2),
            "expanded": lambda shape: torch.randn(shape[-2], 1, dtype=bf16).expand(*shape)}
    a = make[a_kind](shapes[form][0]).detach().requires_grad_()
    b = make[b_kind](shapes[form][1]).detach().requires_grad_()
    x, y = (a, b)
    out = grouped_mm(x, y, offs, out_dtype=out_dtype)
    torch.testing.assert_close(out.double(), _loop(form, x.double(), y.double(), offs), atol=0.1, rtol=0.05)
    grad = torch.ones(()).expand(out.shape).to(out.dtype) if upstream == "expanded" else torch.randn_like(out)
    got = torch.autograd.grad(out, (a, b), grad)
    want = torch.autograd.grad(_loop(form, x.double(), y.double(), offs), (a, b), grad.double())
    for name, g, w in zip("ab", got, want):
        torch.testing.assert_close(g.double(), w.double(), atol=0.1, rtol=0.05,
                                   msg=lambda text, name=name: f"grad {name}: {text}")


def test_an_operand_of_the_wrong_rank_reaches_grouped_matmuls_refusal_on_the_cublaslt_path(monkeypatch):
    """A 1-D operand on the cuBLASLt path is handed to ``grouped_matmul``, which refuses it by name (the
    op's layout reading must not fail first with an IndexError), inside an ``autotune()`` context too."""
    import nvblaslt
    from nvblaslt import NvblasltValueError
    from nvblaslt.torch import _grouped, autotune

    def refuse(a, b, offs, *, out_dtype):
        raise NvblasltValueError("a, b: expected 2-D or 3-D operands")
    monkeypatch.setattr(nvblaslt, "grouped_matmul", refuse)
    monkeypatch.setattr(_grouped, "_tune", lambda *args: None)
    a, b = torch.randn(12, dtype=torch.bfloat16), torch.randn(3, 12, 4, dtype=torch.bfloat16)
    offs = torch.tensor([4, 8, 12], dtype=torch.int32)
    for context in (contextlib.nullcontext(), autotune(iterations=1)):
        with context, pytest.raises(NvblasltValueError, match="expected 2-D or 3-D operands"):
            _grouped._native(a, b, offs, torch.bfloat16)
