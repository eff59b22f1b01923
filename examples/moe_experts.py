"""A mixture-of-experts layer's forward and backward with grouped GEMMs (nvblaslt.torch.GroupedLinear).

Tokens are routed to their top-1 expert, sorted by expert, and every expert's two-layer MLP
(up-projection, GELU, down-projection) runs over its share in one grouped GEMM per layer: the offsets
that split the tokens stay on the GPU. The backward pass (the input gradient and every expert's
weight gradient) is grouped GEMMs too. Everything is checked against a loop over the experts in
float64, including an expert that gets no token.

On a GPU with cuBLASLt 13.4 or newer (NVBLASLT_LIBRARY; see docs/guide/grouped.md) the GEMMs are
cuBLASLt's, in bfloat16; elsewhere the same layer runs with torch's matmuls in float64.

    python examples/moe_experts.py [--device cpu]
"""

import argparse
import sys

try:
    import torch
except ImportError:
    sys.exit("this example needs PyTorch")

from torch import nn
from torch.nn import functional as F

import nvblaslt
from nvblaslt.torch import GroupedLinear

parser = argparse.ArgumentParser()
parser.add_argument("--device", choices=["auto", "cpu"], default="auto",
                    help="cpu: torch's matmuls as the GEMMs, even where there is a GPU")
args = parser.parse_args()


def grouped_gemm_gpu() -> bool:
    return (args.device == "auto" and torch.cuda.is_available() and nvblaslt.library().version >= 130400
            and torch.cuda.get_device_capability()[0] in (9, 10, 11))


device, dtype = ("cuda", torch.bfloat16) if grouped_gemm_gpu() else ("cpu", torch.float64)
print(f"grouped GEMMs on {device} ({'cuBLASLt' if device == 'cuda' else 'torch matmuls'}), {dtype}")


class MoE(nn.Module):
    """Top-1 routing to ``experts`` MLPs of ``hidden`` units, in two grouped GEMMs."""

    def __init__(self, experts: int, features: int, hidden: int):
        super().__init__()
        self.router = nn.Linear(features, experts)
        self.up = GroupedLinear(experts, features, hidden)
        self.down = GroupedLinear(experts, hidden, features)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top-1 expert and its probability."""
        weight, expert = self.router(x).softmax(dim=-1).max(dim=-1)
        return weight, expert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, expert = self.route(x)
        order = expert.argsort(stable=True)                          # tokens sorted by expert
        counts = torch.bincount(expert, minlength=self.up.groups)
        offs = counts.cumsum(0).to(torch.int32)                      # where each expert's tokens end
        hidden = F.gelu(self.up(x[order], offs), approximate="tanh")
        out = torch.empty_like(x)
        out[order] = self.down(hidden, offs)                         # back in the tokens' order
        return out * weight[:, None]


def loop_reference(moe: MoE, x: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """The same layer as a loop over the experts, in float64, each token sent to ``expert`` (the bf16
    model's choice: a token whose top two router scores are within bf16 rounding may pick another
    expert in float64, and its row would then differ by design, not by error)."""
    x = x.double()
    probabilities = (x @ moe.router.weight.double().T + moe.router.bias.double()).softmax(dim=-1)
    weight = probabilities.gather(-1, expert[:, None]).squeeze(-1)
    out = torch.zeros_like(x)
    for e in range(moe.up.groups):
        rows = (expert == e).nonzero().flatten()
        h = F.gelu(x[rows] @ moe.up.weight[e].double().T, approximate="tanh")
        out[rows] = h @ moe.down.weight[e].double().T
    return out * weight[:, None]


torch.manual_seed(0)
experts, features, hidden, tokens = 8, 256, 512, 1024
moe = MoE(experts, features, hidden).to(device=device, dtype=dtype)
with torch.no_grad():
    moe.router.bias[3] = -1e4  # expert 3 never wins: its group is empty
x = torch.randn(tokens, features, device=device, dtype=dtype, requires_grad=True)

out = moe(x)
out.square().mean().backward()
reference_moe = MoE(experts, features, hidden).to(device=device, dtype=torch.float64)
reference_moe.load_state_dict({k: v.double() for k, v in moe.state_dict().items()})
x64 = x.detach().double().requires_grad_()
with torch.no_grad():
    _, routed = moe.route(x)
want = loop_reference(reference_moe, x64, routed)
want.square().mean().backward()

tolerance = 1e-9 if dtype == torch.float64 else 3e-2
checks = {
    "output": (out, want),
    "input gradient": (x.grad, x64.grad),
    "up-projection weight gradients": (moe.up.weight.grad, reference_moe.up.weight.grad),
    "down-projection weight gradients": (moe.down.weight.grad, reference_moe.down.weight.grad),
}
every = True
for name, (got, expected) in checks.items():
    error = ((got.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()
    ok = error <= tolerance
    every &= ok
    print(f"{name}: max error {error:.1e} relative to the largest value, within {tolerance:g}: {ok}")
tokens_per_expert = torch.bincount(routed, minlength=experts).tolist()
print(f"tokens per expert: {tokens_per_expert}; the empty expert's weight gradients are zero: "
      f"{bool(moe.up.weight.grad[3].abs().max() == 0 and moe.down.weight.grad[3].abs().max() == 0)}")
print(f"all checks passed: {every}")
sys.exit(0 if every else 1)
