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
