"""A 2-D convolution as GEMMs: the layouts and index math, with the GEMMs passed in.

Channels-last (NHWC) memory makes a convolution a GEMM over patches. For x (N, C, H, W) stored
channels-last, weight (O, C, KH, KW), output (N, O, OH, OW), M = N·OH·OW and K = KH·KW·C:

- ``im2col``: cols (M, K), row (n, oh, ow), column (i, j, c) = x[n, c, oh·sh − ph + i·dh, ow·sw − pw + j·dw]
  (zero outside x). A pointwise convolution (1×1, stride 1, no padding) needs none: x's own
  memory, read as (N·H·W, C), is cols.
- ``weight_matrix``: W (O, K), column (i, j, c) = weight[o, c, i, j]: a view for channels-last and
  1×1 weights, a small copy otherwise.
- forward: out_rows (M, O) = act(cols Wᵀ + b), the same memory as out (N, O, OH, OW) channels-last.
- backward, with dz = dy ⊙ act′ (M, O): dW = dzᵀ cols, db = Σ_rows dz, dcols = dz W, and
  dx = ``col2im``(dcols), the adjoint of im2col (each column summed back onto the pixel it came from).
  cols is recomputed from x: the backward keeps x, the weight and what the fused forward returned
  (the output for ReLU, the pre-activation for GELU), as the Conv-Bias-ReLU seed argues.

``forward`` / ``backward`` do this around GEMMs they are given (``Gemm`` / ``GemmBackward``): nvblaslt's
custom ops in ``_conv``, a plain float64 matmul in the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

Pair = tuple[int, int]

# (cols (M, K), W (O, K), bias (O,) or None, activation, keep_aux) -> (act(cols Wᵀ + b) (M, O), aux or None)
Gemm = Callable[[Tensor, Tensor, "Tensor | None", str, bool], tuple[Tensor, "Tensor | None"]]
# (dy (M, O), cols (M, K) or None when dW is not wanted, W (O, K), out rows (M, O) or None, aux, activation,
#  bias_grad, input_grad, weight_grad) -> (dcols (M, K), dW (O, K), db (O,)), each None where not asked for
GemmBackward = Callable[[Tensor, "Tensor | None", Tensor, "Tensor | None", Tensor, str, bool, bool, bool],
                        tuple["Tensor | None", "Tensor | None", "Tensor | None"]]


class Geometry(NamedTuple):
    """A convolution's kernel, stride, padding and dilation, each (along H, along W)."""

    kernel: Pair
    stride: Pair
    padding: Pair
    dilation: Pair

    def output_size(self, height, width) -> tuple:
        """(OH, OW) for an input of (H, W), as ``nn.Conv2d`` computes it."""
        return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in
                     zip((height, width), self.kernel, self.stride, self.padding, self.dilation))

    @property
    def pointwise(self) -> bool:
        """1×1, stride 1, no padding: cols is x itself (dilation does not matter)."""
        return self.kernel == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)


# ---- layouts ----------------------------------------------------------------------------------------------


def nhwc(t: Tensor) -> Tensor:
    """(N, C, H, W) stored channels-last, as the (N, H, W, C) tensor its memory is (a view)."""
    return t.permute(0, 2, 3, 1)


def nchw(t: Tensor) -> Tensor:
    """(N, H, W, C) contiguous as (N, C, H, W) channels-last (a view)."""
    return t.permute(0, 3, 1, 2)


def rows(t: Tensor) -> Tensor:
    """(N, C, H, W) as the (N·H·W, C) matrix of its channels-last memory: a view when ``t`` is channels-last
    contiguous, else one copy (a gradient another op laid out otherwise)."""
    return nhwc(t).reshape(-1, t.shape[1])


def weight_matrix(weight: Tensor) -> Tensor:
    """(O, C, KH, KW) -> (O, KH·KW·C), columns in cols' order."""
    o, c, kh, kw = weight.shape
    return weight.permute(0, 2, 3, 1).reshape(o, kh * kw * c)


def weight_format(weight: Tensor) -> torch.memory_format:
    """The memory format the weight is kept in, which its gradient gets too."""
    if not weight.is_contiguous() and weight.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def weight_from_matrix(matrix: Tensor, weight: Tensor) -> Tensor:
    """(O, KH·KW·C) -> (O, C, KH, KW) in ``weight``'s memory format: a view where the matrix already is
    that layout (a 1×1 kernel, or a channels-last weight), else a weight-sized copy."""
    o, c, kh, kw = weight.shape
    return matrix.view(o, kh, kw, c).permute(0, 3, 1, 2).contiguous(memory_format=weight_format(weight))


# ---- im2col and its adjoint -------------------------------------------------------------------------------


def im2col(x: Tensor, g: Geometry) -> Tensor:
    """x (N, H, W, C) contiguous -> cols (N·OH·OW, KH·KW·C): x itself for a pointwise convolution, else
    one copy of the patches (after a padded copy of x where there is padding)."""
    n, h, w, c = x.shape
    if g.pointwise:
        return x.view(n * h * w, c)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = g.kernel, g.stride, g.padding, g.dilation
    oh, ow = g.output_size(h, w)
    if ph or pw:
        x = nn.functional.pad(x, (0, 0, pw, pw, ph, ph))
    sn, sy, sx, sc = x.stride()
    patches = x.as_strided((n, oh, ow, kh, kw, c), (sn, sh * sy, sw * sx, dh * sy, dw * sx, sc), x.storage_offset())
    return patches.reshape(n * oh * ow, kh * kw * c)


def _overlap(offset: int, size: int, outputs: int, stride: int, padding: int) -> tuple[int, int, int] | None:
    """Along one axis, the outputs o whose input o·stride − padding + offset lies inside [0, size):
    (first o, count, the first one's input index), or None when there is none."""
    first = max(0, -((offset - padding) // stride))  # ceil((padding - offset) / stride)
    last = min(outputs - 1, (size - 1 + padding - offset) // stride)
    if last < first:
        return None
    return first, last - first + 1, first * stride - padding + offset


def col2im(cols: Tensor, g: Geometry, shape: tuple) -> Tensor:
    """The adjoint of ``im2col``: cols (N·OH·OW, KH·KW·C) -> (N, H, W, C) contiguous, each column added
    onto the pixel it was read from (padding's columns dropped). A view of cols for a pointwise
    convolution; else one zeroed tensor and KH·KW strided additions (deterministic, no atomics)."""
    n, h, w, c = shape
    if g.pointwise:
        return cols.view(n, h, w, c)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = g.kernel, g.stride, g.padding, g.dilation
    oh, ow = g.output_size(h, w)
    blocks = cols.view(n, oh, ow, kh, kw, c)
    x = cols.new_zeros((n, h, w, c))
    for i in range(kh):
        along_h = _overlap(i * dh, h, oh, sh, ph)
        if along_h is None:
            continue
        o0, count_h, y0 = along_h
        for j in range(kw):
            along_w = _overlap(j * dw, w, ow, sw, pw)
            if along_w is None:
                continue
            q0, count_w, x0 = along_w
            x[:, y0: y0 + sh * (count_h - 1) + 1: sh, x0: x0 + sw * (count_w - 1) + 1: sw] += \
                blocks[:, o0: o0 + count_h, q0: q0 + count_w, i, j]
    return x


# ---- the convolution around the GEMMs ---------------------------------------------------------------------


def forward(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str, keep_aux: bool, g: Geometry,
            gemm: Gemm) -> tuple[Tensor, Tensor | None]:
    """x (N, C, H, W) channels-last -> (out (N, O, OH, OW) channels-last, aux as ``gemm`` keeps it)."""
    n, _, h, w = x.shape
    oh, ow = g.output_size(h, w)
    out_rows, aux = gemm(im2col(nhwc(x), g), weight_matrix(weight), bias, activation, keep_aux)
    return nchw(out_rows.view(n, oh, ow, weight.shape[0])), aux


def backward(grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor | None, aux: Tensor, activation: str,
             bias_grad: bool, input_grad: bool, weight_grad: bool, g: Geometry,
             gemm_backward: GemmBackward) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(dx (N, C, H, W) channels-last, dW in the weight's format, db), None where not asked for. ``out``:
    the forward's output (ReLU's backward reads it), ``aux``: what the forward kept (GELU's pre-activation)."""
    n, c, h, w = x.shape
    cols = im2col(nhwc(x), g) if weight_grad else None  # recomputed from x, which is what the backward keeps
    dcols, dw, db = gemm_backward(rows(grad_out), cols, weight_matrix(weight), None if out is None else rows(out),
                                  aux, activation, bias_grad, input_grad, weight_grad)
    dx = nchw(col2im(dcols, g, (n, h, w, c))) if input_grad and dcols is not None else None
    return dx, (weight_from_matrix(dw, weight) if weight_grad and dw is not None else None), db
