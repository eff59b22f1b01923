"""nvblaslt.torch's batch_invariant switch (issue 35): linear(), FusedLinear and fuse() run their forward
GEMMs with MatmulOptions(batch_invariant=…) naming the tokens' extent of each GEMM, and nothing changes
without it. On the CPU, with the ops' CUDA path run and nvblaslt.matmul replaced by a recorder."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nvblaslt import NvblasltTypeError  # noqa: E402
from nvblaslt.torch import FusedLinear, fuse, linear  # noqa: E402
from nvblaslt.torch import _gemms, _ops  # noqa: E402


class Recorder:
    """nvblaslt.matmul for the forward's elementwise and bias epilogs, computed with torch; records options."""

    def __init__(self):
        self.calls = []

    def __call__(self, a, b, *, epilog, epilog_inputs=None, options=None):
        self.calls.append((epilog.name, None if options is None else options.batch_invariant))
        z = a @ b
        if epilog_inputs and "bias" in epilog_inputs:
            z = z + epilog_inputs["bias"][:, None]
        return torch.relu(z) if "RELU" in epilog.name else z


@pytest.fixture
def recorder(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(_gemms, "matmul", recorder)
    monkeypatch.setattr(_ops, "uses_cublaslt", lambda x: True)
    return recorder


def test_linear_names_the_tokens_extent_of_each_forward_gemm(recorder):
    x, weight, bias = torch.randn(5, 8), torch.randn(4, 8), torch.randn(4)
    with torch.no_grad():
        expected = torch.relu(x @ weight.T + bias)
        assert torch.allclose(linear(x, weight, bias, "relu", batch_invariant=True), expected, atol=1e-5)
        linear(x, weight, None, "relu", batch_invariant=True)
        linear(x, weight, bias, "relu")
    # with a bias the GEMM is W @ xᵀ: the tokens are its columns; without, x @ Wᵀ: its rows
    assert recorder.calls == [("RELU_BIAS", "columns"), ("RELU", "rows"), ("RELU_BIAS", None)]


def test_fused_linear_and_fuse_carry_the_switch(recorder):
    layer = FusedLinear(8, 4, activation="relu", batch_invariant=True)
    assert "batch_invariant=True" in repr(layer)
    model = fuse(torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2)),
                 batch_invariant=True)
    with torch.no_grad():
        layer(torch.randn(3, 8))
        model(torch.randn(3, 8))
    assert [options for _, options in recorder.calls] == ["columns"] * 3
    recorder.calls.clear()
    plain = fuse(torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU()))
    with torch.no_grad():
        plain(torch.randn(3, 8))
    assert recorder.calls == [("RELU_BIAS", None)]


def test_the_switch_must_be_a_bool():
    with pytest.raises(NvblasltTypeError, match="batch_invariant: expected a bool"):
        linear(torch.ones(2, 3), torch.ones(4, 3), batch_invariant="yes")
    with pytest.raises(NvblasltTypeError, match="batch_invariant: expected a bool"):
        FusedLinear(3, 4, batch_invariant=1)
    with pytest.raises(NvblasltTypeError, match="batch_invariant: expected a bool"):
        fuse(torch.nn.Linear(3, 4), batch_invariant=None)
