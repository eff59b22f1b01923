"""``FusedConv2d`` and ``conv2d()``: Conv2d + bias + ReLU / tanh-GELU as nvblaslt GEMMs with fused epilogs.

The convolution is a GEMM over patches of channels-last memory (``_im2col`` has the layouts): a
pointwise (1×1, stride 1, no padding) convolution is one GEMM on x's own memory, with no copy; any
other kernel goes through an im2col copy first. Each GEMM is ``nvblaslt::linear`` /
``nvblaslt::linear_backward``, the ops ``FusedLinear`` runs on, so the epilogs are the same:

- forward: RELU_BIAS (ReLU), GELU_AUX_BIAS (GELU, keeping the pre-activation for the backward pass),
  BIAS or DEFAULT;
- backward: the activation's derivative as a torch op (from the output for ReLU, the seed's point),
  dW = dzᵀ cols with BGRADB giving the bias gradient in the same call, dcols = dz W, then col2im.

Both steps are torch custom ops (``nvblaslt::conv2d``, ``nvblaslt::conv2d_backward``, in ``_conv_ops``)
with fake implementations and a registered autograd formula, so ``FusedConv2d`` works under
``torch.compile(fullgraph=True)``. The backward keeps x, the weight and the output (or GELU's
pre-activation), nothing else: cols is recomputed from x where the weight gradient needs it.

Modules, each calling only those below it: ``_conv`` (the module, the function, argument checks) →
``_conv_ops`` (the custom ops) → ``_im2col`` (layouts and the convolution around GEMMs it is given) and
the linear ops of ``_ops``.

Input must be channels-last (``x.is_contiguous(memory_format=torch.channels_last)``); anything else is
refused rather than copied on every call. ``groups`` other than 1 and ``padding_mode`` other than
"zeros" are refused.
"""

from __future__ import annotations

import operator
from typing import cast

import torch
from torch import Tensor, nn

from .. import NvblasltError, NvblasltTypeError, NvblasltValueError
from ._conv_ops import fused_conv
from ._functional import activation_name, autocast_inputs, check_like_x
from ._im2col import Geometry

# ---- arguments ---------------------------------------------------------------------------------------------

CHANNELS_LAST_HINT = ("convert it once with x.contiguous(memory_format=torch.channels_last) (one copy of x) and "
                      "keep the model channels-last (model.to(memory_format=torch.channels_last)); FusedConv2d "
                      "does not copy it on every call")


def _pair(argument: str, value, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints ≥ ``minimum``, as nn.Conv2d takes them."""
    items = (value, value) if not isinstance(value, (tuple, list)) else tuple(value)
    try:
        numbers = tuple(None if isinstance(v, bool) else operator.index(v) for v in items)
    except TypeError:
        numbers = (None,)
    if len(numbers) != 2 or None in numbers:
        raise NvblasltTypeError(f"{argument}: expected an int or a pair of ints, got {value!r}")
    pair = cast(tuple[int, int], numbers)
    if min(pair) < minimum:
        raise NvblasltValueError(f"{argument}: expected values ≥ {minimum}, got {value!r}")
    return pair


def conv_arguments(kernel: tuple[int, int], stride: object, padding: object, dilation: object, groups: object,
                   padding_mode: object = "zeros") -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(stride, padding, dilation) as pairs, checked; unsupported groups / padding modes refused by name."""
    try:
        count = None if isinstance(groups, bool) else operator.index(groups)  # type: ignore[arg-type]
    except TypeError:
        count = None
    if count is None:
        raise NvblasltTypeError(f"groups: expected an int, got {groups!r}")
    if count != 1:
        raise NvblasltValueError(f"groups: only 1 is fused (a grouped convolution is no single GEMM), got {count}")
    if padding_mode != "zeros":
        raise NvblasltValueError(f"padding_mode: only 'zeros' is fused, got {padding_mode!r}")
    stride, dilation = _pair("stride", stride, 1), _pair("dilation", dilation, 1)
    if padding == "valid":
        return stride, (0, 0), dilation
    if padding == "same":
        if stride != (1, 1):
            raise NvblasltValueError(f"padding: 'same' needs stride 1, got stride {stride}")
        totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
        if any(t % 2 for t in totals):
            raise NvblasltValueError(f"padding: 'same' with kernel {kernel} and dilation {dilation} pads one side "
                                     "more than the other, which is not fused; pad x first")
        return stride, (totals[0] // 2, totals[1] // 2), dilation
    if isinstance(padding, str):
        raise NvblasltValueError(f"padding: expected 'valid', 'same', an int or a pair of ints, got {padding!r}")
    return stride, _pair("padding", padding, 0), dilation


def _check(x: Tensor, weight: Tensor, bias: Tensor | None, g: Geometry) -> None:
    if weight.dim() != 4:
        raise NvblasltValueError(f"weight: expected a 4-D (out_channels, in_channels, kH, kW) tensor, got shape "
                                 f"{tuple(weight.shape)}")
    if x.dim() != 4 or x.shape[1] != weight.shape[1]:
        raise NvblasltValueError(f"x: expected a 4-D (N, {weight.shape[1]}, H, W) tensor to match weight's "
                                 f"in_channels, got shape {tuple(x.shape)}")
    check_like_x(x, weight, bias)
    if min(g.output_size(x.shape[2], x.shape[3])) < 1:
        raise NvblasltValueError(f"x: its {tuple(x.shape[2:])} pixels are smaller than the kernel's reach "
                                 f"(kernel {g.kernel}, padding {g.padding}, dilation {g.dilation})")
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise NvblasltValueError(f"x: expected channels-last memory, got strides {x.stride()} for shape "
                                 f"{tuple(x.shape)}; {CHANNELS_LAST_HINT}")


# ---- the entries --------------------------------------------------------------------------------------------


IntPair = int | tuple[int, int]


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntPair = 1, padding: IntPair | str = 0,
           dilation: IntPair = 1, groups: int = 1, activation: str | None = None) -> Tensor:
    """``activation(nn.functional.conv2d(x, weight, bias, stride, padding, dilation))`` as nvblaslt GEMMs
    with fused epilogs on CUDA, autograd-aware.

    A pointwise convolution (1×1, stride 1, no padding) is one cuBLASLt call on x's own memory
    (RELU_BIAS, GELU_AUX_BIAS, BIAS or a plain GEMM); any other kernel copies x's patches first (im2col)
    and sums the input gradient back (col2im). The backward pass runs the activation's derivative as a
    torch op, BGRADB for the weight and bias gradients in one call, and a GEMM for the input gradient;
    it keeps x, the weight and the output (GELU: its pre-activation) only. Tensors on any other device
    run the same math as torch ops. Under autocast the inputs are cast as autocast casts
    ``nn.Conv2d``'s. It is the torch custom op ``torch.ops.nvblaslt.conv2d``, so it works under
    ``torch.compile(fullgraph=True)``.

    Parameters
    ----------
    x : torch.Tensor
        (N, C, H, W) in channels-last memory (``x.is_contiguous(memory_format=torch.channels_last)``);
        any other layout is refused, not copied on every call.
    weight : torch.Tensor
        (O, C, kH, kW), of ``x``'s dtype and device; any memory format (channels-last is a view, others
        a weight-sized copy per call).
    bias : torch.Tensor or None, optional
        (O,), of ``x``'s dtype and device.
    stride, dilation : int or (int, int), optional
        As for ``nn.functional.conv2d``, each ≥ 1.
    padding : int, (int, int), "valid" or "same", optional
        Zero padding as for ``nn.functional.conv2d``; ``"same"`` only where it pads both sides alike.
    groups : int, optional
        Must be 1: a grouped convolution is no single GEMM.
    activation : {None, "relu", "gelu"}, optional
        ``"gelu"`` is the tanh approximation; exact GELU is refused.

    Returns
    -------
    torch.Tensor
        (N, O, OH, OW), channels-last, of ``x``'s dtype (float16, bfloat16, float32 or float64).

    Raises
    ------
    NvblasltTypeError
        A tensor argument is not a tensor, the dtypes differ or are not floating, or stride / padding /
        dilation are not ints.
    NvblasltValueError
        ``x`` is not channels-last, the shapes do not match, ``groups`` ≠ 1, a value is out of range, the
        image is smaller than the kernel's reach, or ``activation`` is unknown or exact GELU.

    Examples
    --------
    >>> import torch
    >>> from nvblaslt.torch._conv import conv2d
    >>> x = torch.arange(9.0).reshape(1, 3, 3, 1).permute(0, 3, 1, 2)  # NHWC memory: channels-last
    >>> conv2d(x, torch.ones(1, 1, 2, 2), activation="relu")[0, 0]
    tensor([[ 8., 12.],
            [20., 24.]])
    """
    activation = activation_name(activation)
    for name, t in (("weight", weight), ("bias", bias)):
        if not isinstance(t, Tensor) and not (name == "bias" and t is None):
            raise NvblasltTypeError(f"{name}: expected a torch.Tensor{' or None' if name == 'bias' else ''}, got "
                                    f"{type(t).__module__}.{type(t).__qualname__}")
    kernel = (weight.shape[-2], weight.shape[-1]) if weight.dim() >= 2 else (1, 1)
    return _conv(x, weight, bias, Geometry(kernel, *conv_arguments(kernel, stride, padding, dilation, groups)),
                 activation)


def _conv(x: Tensor, weight: Tensor, bias: Tensor | None, g: Geometry, activation: str) -> Tensor:
    """``conv2d()`` of checked parameters (its geometry and activation resolved): x checked, cast, convolved."""
    if not isinstance(x, Tensor):
        raise NvblasltTypeError(f"x: expected a torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}")
    x, weight, bias = autocast_inputs(x, weight, bias)
    _check(x, weight, bias, g)
    return fused_conv(x, weight, bias, activation, g)


def _count(argument: str, value) -> int:
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < 0:
        cls = NvblasltTypeError if number is None else NvblasltValueError
        raise cls(f"{argument}: expected an int ≥ 0, got {value!r}")
    return number


class FusedConv2d(nn.Module):
    """``nn.Conv2d`` followed by an activation, fused into nvblaslt GEMMs with epilogs on CUDA.

    The same parameters (``weight``, ``bias``), initialization and ``state_dict`` keys as
    ``nn.Conv2d(in_channels, out_channels, kernel_size, …)``, so ``nn.Conv2d`` checkpoints load into it.
    The forward pass is ``conv2d(x, weight, bias, stride, padding, dilation, activation=activation)``:
    channels-last input only.

    Parameters
    ----------
    in_channels, out_channels : int
        As for ``nn.Conv2d``, ints ≥ 0.
    kernel_size : int or (int, int)
        Each ≥ 1.
    stride, padding, dilation : optional
        As for ``nn.Conv2d`` (``padding`` also ``"valid"`` or a symmetric ``"same"``).
    groups : int, default 1
        Must be 1.
    bias : bool, default True
        Whether the layer has a learnable bias.
    padding_mode : str, default "zeros"
        Must be ``"zeros"``.
    activation : {None, "relu", "gelu"}, optional
        The activation after the bias; ``"gelu"`` is the tanh approximation. Exact GELU is refused.
    device, dtype : optional
        Where and of what dtype the parameters are made, as for ``nn.Conv2d``.

    Raises
    ------
    NvblasltTypeError
        A size is not an integer (or pair of integers).
    NvblasltValueError
        A size is out of range, ``groups`` ≠ 1, ``padding_mode`` ≠ "zeros", or ``activation`` is unknown
        or exact (erf) GELU.

    Examples
    --------
    >>> import torch
    >>> from nvblaslt.torch._conv import FusedConv2d
    >>> layer = FusedConv2d(8, 16, 1, activation="relu")
    >>> layer
    FusedConv2d(8, 16, kernel_size=(1, 1), stride=(1, 1), activation='relu')
    >>> sorted(layer.state_dict()) == sorted(torch.nn.Conv2d(8, 16, 1).state_dict())
    True
    >>> x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    >>> y = layer(x)
    >>> y.shape, y.is_contiguous(memory_format=torch.channels_last), bool((y >= 0).all())
    (torch.Size([2, 16, 5, 5]), True, True)
    """

    __constants__ = ["in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "activation"]
    weight: Tensor
    bias: Tensor | None
    resolved_padding: tuple[int, int]  # the padding as pixels, "same" and "valid" resolved
    _parsed: tuple[tuple, Geometry]  # (what it was parsed from, the geometry): forward's fast path

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntPair, stride: IntPair = 1,
                 padding: IntPair | str = 0, dilation: IntPair = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", activation: str | None = None,
                 device: torch.device | str | int | None = None, dtype: torch.dtype | None = None) -> None:
        in_channels, out_channels = _count("in_channels", in_channels), _count("out_channels", out_channels)
        kernel = _pair("kernel_size", kernel_size, 1)
        stride, resolved, dilation = conv_arguments(kernel, stride, padding, dilation, groups, padding_mode)
        super().__init__()
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel
        self.stride, self.dilation, self.groups, self.padding_mode = stride, dilation, 1, "zeros"
        self.padding = padding if isinstance(padding, str) else resolved  # as nn.Conv2d keeps it
        self.resolved_padding = resolved
        self.activation = activation_name(activation)
        self.weight = nn.Parameter(torch.empty((out_channels, in_channels, *kernel), device=device, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        self._parse()

    def reset_parameters(self) -> None:
        """Initialize ``weight`` and ``bias`` as ``nn.Conv2d`` does, drawing the same random numbers."""
        nn.Conv2d.reset_parameters(cast(nn.Conv2d, self))

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, activation: str | None = None) -> FusedConv2d:
        """A FusedConv2d sharing ``conv``'s parameters: not copies, so optimizers holding them still work.

        Parameters
        ----------
        conv : torch.nn.Conv2d
            The layer whose ``weight`` and ``bias`` (and training mode) the new layer takes; a grouped
            convolution or another padding mode than zeros is refused (NvblasltValueError).
        activation : {None, "relu", "gelu"}, optional
            As for ``FusedConv2d``.

        Returns
        -------
        FusedConv2d
            A new module holding the very same ``Parameter`` objects.
        """
        if not isinstance(conv, nn.Conv2d):
            raise NvblasltTypeError(f"conv: expected a torch.nn.Conv2d, got {type(conv).__module__}."
                                    f"{type(conv).__qualname__}")
        # made on the meta device (no memory, no initialization), then given conv's own parameters
        fused = cls(conv.in_channels, conv.out_channels, cast(IntPair, conv.kernel_size), cast(IntPair, conv.stride),
                    cast("IntPair | str", conv.padding), cast(IntPair, conv.dilation), conv.groups,
                    conv.bias is not None, conv.padding_mode, activation, device="meta")
        fused.weight = conv.weight
        fused.bias = conv.bias
        fused.train(conv.training)
        return fused

    def forward(self, x: Tensor) -> Tensor:
        """``activation(conv2d(x) + bias)``, as ``conv2d()`` computes it.

        Parameters
        ----------
        x : torch.Tensor
            (N, in_channels, H, W) in channels-last memory, of the parameters' dtype and device.

        Returns
        -------
        torch.Tensor
            (N, out_channels, OH, OW), channels-last.

        Raises
        ------
        NvblasltTypeError, NvblasltValueError
            As ``conv2d()`` raises them (a channels-first ``x`` among them).
        """
        # the geometry as parsed when the layer was made, while its parameters still match it: a step's host
        # time is the layer's cost, and nn.Module keeps weight a Parameter and bias a Parameter or None
        parsed = self.__dict__.get("_parsed")  # None in a layer pickled before it had one
        if parsed is None or parsed[0] != (self.weight.shape[2:], self.stride, self.resolved_padding, self.dilation,
                                           self.activation):
            return conv2d(x, self.weight, self.bias, self.stride, self.resolved_padding, self.dilation, 1,
                          self.activation)
        return _conv(x, self.weight, self.bias, parsed[1], self.activation)

    def _parse(self) -> None:
        kernel = self.kernel_size
        self._parsed = ((kernel, self.stride, self.resolved_padding, self.dilation, self.activation),
                        Geometry(kernel, self.stride, self.resolved_padding, self.dilation))

    def extra_repr(self) -> str:
        """The layer's sizes, as ``nn.Conv2d`` shows them, and its activation, for ``repr()``."""
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):  # as nn.Conv2d shows it: "valid" and "same" too
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.bias is None:
            text += ", bias=False"
        return text + (f", activation={self.activation!r}" if self.activation != "none" else "")


# Kernels worth fusing with the activation after them: pointwise only, until the bench says otherwise
# (``python -m nvblaslt.bench.conv``: a k×k convolution's im2col and col2im copies cost more than the
# kernels the fusion saves, against cuDNN's implicit GEMM).
FUSED_KERNELS = {(1, 1)}


def pays_to_fuse(conv: nn.Module) -> bool:
    """Whether ``fuse()`` should turn this ``nn.Conv2d`` (+ the activation after it) into a ``FusedConv2d``:
    a kernel in ``FUSED_KERNELS``, and for 1×1 the pointwise geometry (stride 1, no padding: no copy);
    groups 1 and zero padding mode, as FusedConv2d takes."""
    if not isinstance(conv, nn.Conv2d):
        return False
    kernel = cast(tuple[int, int], tuple(conv.kernel_size))
    try:
        g = Geometry(kernel, *conv_arguments(kernel, conv.stride, conv.padding, conv.dilation, conv.groups,
                                             conv.padding_mode))
    except NvblasltError:
        return False
    return kernel in FUSED_KERNELS and (g.pointwise or kernel != (1, 1))
