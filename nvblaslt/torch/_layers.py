"""The modules: ``FusedLinear`` (``nn.Linear`` + activation), ``FusedSequential`` (fusing across its
``FusedLinear`` layers) and ``fuse()``, which turns a model's ``nn.Linear`` (+ activation) into them."""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Any, cast

import torch
from torch import Tensor, nn

from .. import NvblasltTypeError, NvblasltValueError
from ._conv import FusedConv2d, pays_to_fuse
from ._functional import EXACT_GELU_HINT, activation_name, linear, linked_layer
from ._fuse_timing import candidates_in, paying
from ._tuning import check_backward, check_switch, invariant


def _features(argument: str, value: Any) -> int:
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
    """``nn.Linear`` followed by an activation, fused into one cuBLASLt call on CUDA.

    The same parameters (``weight``, ``bias``), initialization and ``state_dict`` keys as
    ``nn.Linear(in_features, out_features, bias)``, so ``nn.Linear`` checkpoints load into it. Inputs
    of any leading shape; the forward pass is ``linear(x, weight, bias, activation)``.

    Parameters
    ----------
    in_features : int
        Size of each input's last dimension, an int ≥ 0.
    out_features : int
        Size of each output's last dimension, an int ≥ 0.
    bias : bool, default True
        Whether the layer has a learnable bias.
    activation : {None, "relu", "gelu"}, optional
        The activation after the bias; ``"gelu"`` is the tanh approximation
        (``nn.GELU(approximate="tanh")``). Exact GELU is refused.
    device : torch.device, str, int or None, optional
        Where the parameters are made, as for ``nn.Linear``.
    dtype : torch.dtype or None, optional
        The parameters' dtype, as for ``nn.Linear``.
    batch_invariant : bool, default False
        Row i of the output bitwise the same whatever the number of rows: ``linear(…,
        batch_invariant=True)``. An attribute, so it can be switched on a layer ``fuse()`` made.

    Attributes
    ----------
    weight : torch.Tensor
        (out_features, in_features).
    bias : torch.Tensor or None
        (out_features,), or None without a bias.
    activation : str
        ``"none"``, ``"relu"`` or ``"gelu"``.

    Raises
    ------
    NvblasltTypeError
        ``in_features`` or ``out_features`` is not an integer.
    NvblasltValueError
        A width is negative, or ``activation`` is unknown or exact (erf) GELU.

    See Also
    --------
    linear : the layer as a function.
    fuse : turns a model's ``nn.Linear`` (+ activation) layers into these.

    Examples
    --------
    >>> import torch
    >>> from nvblaslt.torch import FusedLinear
    >>> layer = FusedLinear(8, 4, activation="relu")
    >>> layer
    FusedLinear(in_features=8, out_features=4, bias=True, activation='relu')
    >>> sorted(layer.state_dict()) == sorted(torch.nn.Linear(8, 4).state_dict())
    True
    >>> y = layer(torch.randn(5, 3, 8))
    >>> y.shape, bool((y >= 0).all())
    (torch.Size([5, 3, 4]), True)
    """

    __constants__ = ["in_features", "out_features", "activation"]
    in_features: int
    out_features: int
    weight: Tensor
    bias: Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 device: torch.device | str | int | None = None, dtype: torch.dtype | None = None, *,
                 batch_invariant: bool = False) -> None:
        in_features, out_features = _features("in_features", in_features), _features("out_features", out_features)
        super().__init__()
        self.batch_invariant = check_switch(batch_invariant)
        self.in_features, self.out_features = in_features, out_features
        self.activation = activation_name(activation)
        self.weight = nn.Parameter(torch.empty((out_features, in_features), device=device, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialize ``weight`` and ``bias`` as ``nn.Linear`` does, drawing the same random numbers.

        Examples
        --------
        >>> import torch
        >>> from nvblaslt.torch import FusedLinear
        >>> _ = torch.manual_seed(0); fused = FusedLinear(3, 2)
        >>> _ = torch.manual_seed(0); plain = torch.nn.Linear(3, 2)
        >>> torch.equal(fused.weight, plain.weight)
        True
        """
        nn.Linear.reset_parameters(cast(nn.Linear, self))

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str | None = None) -> FusedLinear:
        """A FusedLinear sharing ``linear``'s parameters: not copies, so optimizers holding them still work.

        Parameters
        ----------
        linear : torch.nn.Linear
            The layer whose ``weight`` and ``bias`` (and training mode) the new layer takes.
        activation : {None, "relu", "gelu"}, optional
            As for ``FusedLinear``.

        Returns
        -------
        FusedLinear
            A new module holding the very same ``Parameter`` objects.

        Raises
        ------
        NvblasltValueError
            ``activation`` is unknown or exact (erf) GELU.

        Examples
        --------
        >>> import torch
        >>> from nvblaslt.torch import FusedLinear
        >>> plain = torch.nn.Linear(8, 4)
        >>> fused = FusedLinear.from_linear(plain, activation="gelu")
        >>> fused.weight is plain.weight
        True
        """
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.in_features, fused.out_features = linear.in_features, linear.out_features
        fused.activation = activation_name(activation)
        fused.batch_invariant = False
        fused.weight = linear.weight
        fused.bias = linear.bias
        fused.train(linear.training)
        return fused

    def forward(self, x: Tensor) -> Tensor:
        """``activation(x @ weight.T + bias)``, as ``linear()`` computes it.

        Parameters
        ----------
        x : torch.Tensor
            (…, in_features), of the parameters' dtype and device.

        Returns
        -------
        torch.Tensor
            (…, out_features).

        Raises
        ------
        NvblasltTypeError, NvblasltValueError
            As ``linear()`` raises them.
        """
        return linear(x, self.weight, self.bias, self.activation, batch_invariant=self.batch_invariant)

    def extra_repr(self) -> str:
        """The layer's widths, bias and activation, for ``repr()``."""
        text = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        text += f", activation={self.activation!r}" if self.activation != "none" else ""
        return text + (", batch_invariant=True" if self.batch_invariant else "")


class FusedSequential(nn.Sequential):
    """``nn.Sequential`` that fuses across consecutive ``FusedLinear`` layers.

    A layer's activation backward can run in the next layer's input-gradient GEMM (``nn.Identity``
    between them is skipped; any other module in between ends the chain). ``fuse()`` makes these from
    ``nn.Sequential`` models. The results agree with unfused layers to rounding.

    Parameters
    ----------
    *args : torch.nn.Module or OrderedDict[str, torch.nn.Module]
        The modules, as ``nn.Sequential`` takes them.
    backward : {"auto", "unfused", "bgradb", "epilog"}, default "auto"
        Where each layer's activation backward and bias gradient are computed:

        - ``"epilog"``: DRELU_BGRAD / DGELU_BGRAD in the next layer's input-gradient GEMM, one call for
          both;
        - ``"bgradb"``: DRELU / DGELU there, the bias gradient by BGRADB in the layer's own
          weight-gradient GEMM;
        - ``"unfused"``: the activation backward as a torch op in the layer's own backward (ReLU from
          its output, no bitmask kept), then BGRADB, as a standalone ``FusedLinear`` does;
        - ``"auto"``: ``"unfused"`` for ReLU and ``"bgradb"`` for GELU (``AUTO_BACKWARD``), the
          fastest measured (H200, cuBLASLt 13.1: see ``python -m nvblaslt.bench.mlp``).

        Settable later as the ``backward`` property.

    Raises
    ------
    NvblasltValueError
        ``backward`` is not one of ``BACKWARDS``.

    See Also
    --------
    fuse : makes a ``FusedSequential`` from an ``nn.Sequential``.

    Examples
    --------
    >>> import torch
    >>> from nvblaslt.torch import FusedLinear, FusedSequential
    >>> model = FusedSequential(FusedLinear(8, 16, activation="gelu"), FusedLinear(16, 2), backward="bgradb")
    >>> model(torch.randn(4, 8)).shape
    torch.Size([4, 2])
    >>> model.backward = "fastest"
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: backward: expected one of ('auto', 'unfused', 'bgradb', 'epilog'), got 'fastest'
    """

    def __init__(self, *args: nn.Module | OrderedDict[str, nn.Module], backward: str = "auto") -> None:
        modules: tuple[Any, ...] = args  # nn.Sequential takes modules, or one OrderedDict of them
        super().__init__(*modules)
        self.backward = backward

    @property
    def backward(self) -> str:
        """Where each activation's backward runs: one of ``BACKWARDS`` (see the class)."""
        return self._backward

    @backward.setter
    def backward(self, value: str) -> None:
        self._backward = check_backward(value)

    def forward(self, x: Tensor) -> Tensor:
        """Run the modules in order, linking consecutive ``FusedLinear`` layers.

        Parameters
        ----------
        x : torch.Tensor
            The first module's input.

        Returns
        -------
        torch.Tensor
            The last module's output.
        """
        state = None  # the previous FusedLinear's link, while the chain lasts
        lead = None  # x's leading shape while x is held flattened to 2-D
        for module in self:
            if isinstance(module, FusedLinear):
                if lead is None:
                    lead = x.shape[:-1]
                    x = x.reshape(-1, x.shape[-1]).contiguous()
                with invariant(module.batch_invariant):
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


def fuse(module: nn.Module, *, backward: str = "auto", convolutions: bool = False,
         batch_invariant: bool = False, sample: Any = None) -> nn.Module:
    """Fused layers in place of ``nn.Linear`` (+ ``nn.ReLU`` / ``nn.GELU(approximate="tanh")``).

    An ``nn.Sequential`` becomes a ``FusedSequential``: each Linear followed by an activation becomes
    one ``FusedLinear`` and the activation's slot an ``nn.Identity``, so ``state_dict`` keys stay those
    of the original. Parameters are shared with ``module``, not copied. Other modules are converted
    in place, child by child, and returned.

    Parameters
    ----------
    module : torch.nn.Module
        The model: an ``nn.Linear``, an ``nn.Sequential`` or any module holding them.
    backward : {"auto", "unfused", "bgradb", "epilog"}, default "auto"
        As ``FusedSequential``'s, for every one made.
    convolutions : bool, default False
        Also turn each pointwise (1×1) ``nn.Conv2d`` followed by ``nn.ReLU`` / tanh-GELU in an
        ``nn.Sequential`` into a ``FusedConv2d`` (k×k convolutions stay: see
        ``nvblaslt.torch._conv.FUSED_KERNELS``). The model must then run channels-last.
    batch_invariant : bool, default False
        Set ``batch_invariant`` on every ``FusedLinear`` of the result (made now or already there):
        each one's output rows are then bitwise the same whatever the batch size.
    sample : torch.Tensor or tuple, optional
        An input of ``module`` (a tuple: its arguments), with ``convolutions=True``: the model runs once
        on it, and each candidate convolution is timed on its own input both ways, each step
        synchronized, as a loop that waits for every step runs (forward and backward when ``module`` is
        training, the forward when evaluating). It is converted only where the fused step is measured no
        slower; the times are logged at INFO. Without it, every candidate is converted.

    Returns
    -------
    torch.nn.Module
        A ``FusedLinear`` for an ``nn.Linear``, a ``FusedSequential`` for an ``nn.Sequential``, else
        ``module`` itself with its children converted.

    Raises
    ------
    NvblasltTypeError
        ``module`` is not an ``nn.Module``, or ``convolutions`` or ``batch_invariant`` not a bool.
    NvblasltValueError
        An exact GELU (``nn.GELU()``) follows a Linear, ``backward`` is unknown, or a ``sample`` is given
        without ``convolutions=True`` (it decides only convolutions).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from nvblaslt.torch import fuse
    >>> model = fuse(nn.Sequential(nn.Linear(8, 16), nn.GELU(approximate="tanh"), nn.Linear(16, 2)))
    >>> model
    FusedSequential(
      (0): FusedLinear(in_features=8, out_features=16, bias=True, activation='gelu')
      (1): Identity()
      (2): FusedLinear(in_features=16, out_features=2, bias=True)
    )
    >>> list(model.state_dict())
    ['0.weight', '0.bias', '2.weight', '2.bias']
    >>> fuse(nn.Sequential(nn.Linear(8, 16), nn.GELU()))
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltValueError: module[1]: nn.GELU(approximate='none') is exact (erf) GELU; ...
    """
    if not isinstance(module, nn.Module):
        raise NvblasltTypeError(f"module: expected a torch.nn.Module, got {type(module).__module__}."
                                f"{type(module).__qualname__}")
    if not isinstance(convolutions, bool):
        raise NvblasltTypeError(f"convolutions: expected a bool, got {convolutions!r}")
    invariant_layers = check_switch(batch_invariant)
    backward = check_backward(backward)
    chosen = None  # the convolutions to convert: None, every candidate
    if sample is not None:
        if not convolutions:
            raise NvblasltValueError("sample: it decides which convolutions to fuse; pass convolutions=True "
                                     "with it, or leave it out")
        candidates = list(candidates_in(module, pays_to_fuse, _activation_of))
        chosen = paying(module, sample, candidates, FusedConv2d.from_conv)
    fused = _fuse(module, backward, "module", convolutions, chosen)
    if invariant_layers:
        for layer in fused.modules():
            if isinstance(layer, FusedLinear):
                layer.batch_invariant = True
    return fused


def _slots(sequential: nn.Sequential) -> list[tuple[str, nn.Module]]:
    """(name, module) of each slot of ``sequential``, in order. A module held in two slots is listed in
    both: ``named_children()`` would name it once, and the second slot would be lost."""
    return [(name, child) for name, child in sequential.named_modules(remove_duplicate=False)
            if name and "." not in name]


def _fuse(module: nn.Module, backward: str, where: str, convolutions: bool = False,
          chosen: set[int] | None = None) -> nn.Module:
    if isinstance(module, (FusedLinear, FusedSequential, FusedConv2d)):
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
            elif convolutions and pays_to_fuse(child) and index + 1 < len(items) and (
                    activation := _activation_of(items[index + 1][1], f"{where}[{items[index + 1][0]}]")) and (
                    chosen is None or id(child) in chosen):
                converted[name] = FusedConv2d.from_conv(cast(nn.Conv2d, child), activation)
                converted[items[index + 1][0]] = nn.Identity()
                index += 1
            else:
                converted[name] = _fuse(child, backward, f"{where}[{name}]", convolutions, chosen)
            index += 1
        fused = FusedSequential(converted, backward=backward)
        fused.train(module.training)
        return fused
    for name, child in list(module.named_children()):
        setattr(module, name, _fuse(child, backward, f"{where}.{name}", convolutions, chosen))
    return module
