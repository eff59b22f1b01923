"""The ragged_dot bench without a GPU: its shapes' group sizes, and a clear exit where there is no GPU."""

from __future__ import annotations

import pytest

from nvblaslt.bench import ragged


@pytest.mark.parametrize("shape", ragged.SHAPES, ids=lambda s: s.label)
def test_group_sizes_cover_every_row(shape):
    sizes = ragged.group_sizes(shape)
    assert len(sizes) == shape.experts and sum(sizes) == shape.rows and min(sizes) >= 0
    if shape.skewed:  # Zipf: the first expert takes the most, the last the fewest
        assert sizes[0] > sizes[-1] and sizes == sorted(sizes, reverse=True)
    else:
        assert max(sizes) - min(sizes) <= shape.rows % shape.experts


def test_without_a_gpu_it_says_so_and_exits_2(capsys):
    pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the bench would run")
    assert ragged.main([]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err


def test_the_report_prints_command_buffer_columns_entries_and_replay(capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_graph_min_graph_size=1")
    names = ["XLA ragged_dot fwd", "nvblaslt ragged_dot fwd", "XLA ragged_dot fwd+bwd", "nvblaslt ragged_dot fwd+bwd",
             ragged.CAPTURED_FWD, ragged.CAPTURED_BOTH, "nvblaslt.torch.grouped_mm fwd (GPU time)"]
    ms = dict(zip(names, [20.0, 3.0, 40.0, 6.0, 2.5, 5.0, 2.4]))
    row = {"shape": ragged.SHAPES[0]._asdict(), "ms": ms, "relative_error": 1.7e-3,
           "tflops": {name: 1.0 for name in names},
           "python_entries": {"nvblaslt ragged_dot fwd": 1, "nvblaslt ragged_dot fwd+bwd": 3,
                              ragged.CAPTURED_FWD: 0, ragged.CAPTURED_BOTH: 0},
           "replayed_max_difference": {"fwd": 0.0, "fwd+bwd": 0.0}}
    ragged.report([row])
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("Mixtral"))
    assert line.split()[-4:] == ["2.500", "0.960", "5.000", "8.0"]  # cb fwd, torch's over it, cb f+b, × XLA
    assert "Python entries per call: fwd 1; fwd+bwd 3; fwd, command buffers 0; fwd+bwd, command buffers 0 " \
           "(XLA_FLAGS: --xla_gpu_graph_min_graph_size=1)" in out
    assert "replayed command buffer vs op by op, largest absolute difference: Mixtral-8x7B up fwd 0.0e+00" in out
