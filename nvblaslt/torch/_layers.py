"""The modules: ``FusedLinear`` (``nn.Linear`` + activation), ``FusedSequential`` (fusing across its
``FusedLinear`` layers) and ``fuse()``, which turns a model's ``nn.Linear`` (+ activation) into them."""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import cast

import torch
from torch import Tensor, nn

from .. import NvblasltTypeError, NvblasltValueError
from ._functional import EXACT_GELU_HINT, activation_name, linear, linked_layer
from ._tuning import check_backward


def _features(argument: str, value) -> int:
    """A layer width as nn.Linear takes it (an int ≥ 0, NumPy's too), checked before torch sees it."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None:
        raise NvblasltTypeError(f"{argument}: expected an int ≥ 0, got {type(value).__name__} {value!r}")
    if number < 0:
        raise NvblasltValueError(f"{argument}: expected an int ≥ 0, got {number}")
    return number


class FusedLinear(nn.Module):
    """``nn.Linear`` followed by an activation, fused: the same parameters (``weight``, ``bias``), init
    and ``state_dict`` keys as ``nn.Linear(in_features, out_features, bias)``, so its checkpoints load.

    ``activation``: None, ``"relu"`` or ``"gelu"`` (tanh form). Inputs of any leading shape."""

    __constants__ = ["in_features", "out_features", "activation"]
    in_features: int
    out_features: int
    weight: Tensor
    bias: Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 device=None, dtype=None) -> None:
        in_features, out_features = _features("in_features", in_features), _features("out_features", out_features)
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.activation = activation_name(activation)
        self.weight = nn.Parameter(torch.empty((out_features, in_features), **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s init, drawing the same random numbers."""
        nn.Linear.reset_parameters(cast(nn.Linear, self))

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str | None = None) -> FusedLinear:
        """A FusedLinear sharing ``linear``'s parameters (not copies: optimizers holding them still work)."""
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.in_features, fused.out_features = linear.in_features, linear.out_features
        fused.activation = activation_name(activation)
        fused.weight = linear.weight
        fused.bias = linear.bias
        fused.train(linear.training)
        return fused

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        text = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        return text + (f", activation={self.activation!r}" if self.activation != "none" else "")


class FusedSequential(nn.Sequential):
    """``nn.Sequential`` that can fuse across consecutive ``FusedLinear`` layers (``nn.Identity`` between
    them is skipped): a layer's activation backward can run in the next layer's input-gradient GEMM.
    Any other module in between ends the chain.

    ``backward``: where each layer's activation backward and bias gradient are computed —
    ``"epilog"``: DRELU_BGRAD / DGELU_BGRAD in the next layer's input-gradient GEMM, one call for both;
    ``"bgradb"``: DRELU / DGELU there, the bias gradient by BGRADB in the layer's own weight-gradient GEMM;
    ``"unfused"``: the activation backward as a torch op in the layer's own backward (ReLU from its
    output, no bitmask kept), then BGRADB, as a standalone ``FusedLinear`` does;
    ``"auto"`` (default): ``"unfused"`` for ReLU and ``"bgradb"`` for GELU, the fastest measured
    (H200, cuBLASLt 13.1: see ``python -m nvblaslt.bench.mlp``). The results agree to rounding."""

    def __init__(self, *args, backward: str = "auto"):
        super().__init__(*args)
        self.backward = backward

    @property
    def backward(self) -> str:
        return self._backward

    @backward.setter
    def backward(self, value: str) -> None:
        self._backward = check_backward(value)

    def forward(self, x: Tensor) -> Tensor:
        state = None  # the previous FusedLinear's link, while the chain lasts
        lead = None  # x's leading shape while x is held flattened to 2-D
        for module in self:
            if isinstance(module, FusedLinear):
                if lead is None:
                    lead = x.shape[:-1]
                    x = x.reshape(-1, x.shape[-1]).contiguous()
                x, state = linked_layer(x, module.weight, module.bias, module.activation, state, self._backward)
            elif isinstance(module, nn.Identity):
                continue
            else:
                if lead is not None:
                    x, lead = x.reshape(*lead, x.shape[-1]), None
                state = None
                x = module(x)
        return x if lead is None else x.reshape(*lead, x.shape[-1])


def _activation_of(module: nn.Module, where: str) -> str | None:
    """'relu' / 'gelu' for an activation module fusable after a Linear, None for any other module."""
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.GELU):
        if module.approximate == "tanh":
            return "gelu"
        raise NvblasltValueError(f"{where}: nn.GELU(approximate={module.approximate!r}) is exact (erf) GELU; "
                                 f"{EXACT_GELU_HINT}")
    return None


def fuse(module: nn.Module, *, backward: str = "auto") -> nn.Module:
    """Fused layers in place of ``nn.Linear`` (+ ``nn.ReLU`` / ``nn.GELU(approximate="tanh")``).

    An ``nn.Sequential`` becomes a ``FusedSequential``: each Linear followed by an activation becomes
    one ``FusedLinear`` and the activation's slot an ``nn.Identity``, so ``state_dict`` keys stay those
    of the original. Parameters are shared with ``module``, not copied. Other modules are converted
    in place, child by child, and returned. An exact GELU after a Linear is refused (NvblasltValueError).
    ``backward``: as ``FusedSequential``'s, for every one made."""
    if not isinstance(module, nn.Module):
        raise NvblasltTypeError(f"module: expected a torch.nn.Module, got {type(module).__module__}."
                                f"{type(module).__qualname__}")
    return _fuse(module, check_backward(backward), "module")


def _slots(sequential: nn.Sequential) -> list[tuple[str, nn.Module]]:
    """(name, module) of each slot of ``sequential``, in order. A module held in two slots is listed in
    both: ``named_children()`` would name it once, and the second slot would be lost."""
    return [(name, child) for name, child in sequential.named_modules(remove_duplicate=False)
            if name and "." not in name]


def _fuse(module: nn.Module, backward: str, where: str) -> nn.Module:
    if isinstance(module, (FusedLinear, FusedSequential)):
        return module
    if isinstance(module, nn.Linear):
        return FusedLinear.from_linear(module)
    if isinstance(module, nn.Sequential):
        items = _slots(module)
        converted: OrderedDict[str, nn.Module] = OrderedDict()
        index = 0
        while index < len(items):
            name, child = items[index]
            if isinstance(child, nn.Linear) and not isinstance(child, FusedLinear):
                activation = None
                if index + 1 < len(items):
                    next_name, next_child = items[index + 1]
                    activation = _activation_of(next_child, f"{where}[{next_name}]")
                converted[name] = FusedLinear.from_linear(child, activation)
                if activation is not None:
                    converted[next_name] = nn.Identity()
                    index += 1
            else:
                converted[name] = _fuse(child, backward, f"{where}[{name}]")
            index += 1
        fused = FusedSequential(converted, backward=backward)
        fused.train(module.training)
        return fused
    for name, child in list(module.named_children()):
        setattr(module, name, _fuse(child, backward, f"{where}.{name}"))
    return module
