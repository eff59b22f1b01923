"""Data-parallel training of an MLP of FusedLinear layers: torch.distributed, DistributedDataParallel.

Each rank trains on its own shard of the data. The example shows that
- the gradients are all-reduced: before DDP's all-reduce (under ``no_sync``) the ranks' gradients
  differ; after it every rank holds their mean;
- the replicas stay identical: every step, a checksum of every parameter is gathered from all ranks
  and compared bit for bit;
- the loss curve matches the same model built from nn.Linear (same init, same data, same optimizer)
  within floating-point tolerance.

    torchrun --nproc_per_node=2 examples/torch_ddp_mlp.py                 (2 GPUs, NCCL)
    torchrun --nproc_per_node=2 examples/torch_ddp_mlp.py --device cpu    (no GPU: gloo, the torch-ops path)
"""

import os

# NVLink multicast stays off (NVLS in NCCL, multicast in torch's symmetric memory): set before
# torch.distributed starts.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import sys  # noqa: E402

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
except ImportError:
    sys.exit("this example needs PyTorch")

from nvblaslt.torch import FusedSequential, fuse  # noqa: E402

TOLERANCE = {"float32": 2e-4, "bfloat16": 3e-2}  # largest relative loss difference, fused vs nn.Linear


def mlp(widths: list[int], activation: str) -> nn.Sequential:
    """Linear → activation → … → Linear, as nn.Linear layers."""
    layers: list[nn.Module] = []
    for index, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if index < len(widths) - 2:
            layers.append(nn.ReLU() if activation == "relu" else nn.GELU(approximate="tanh"))
    return nn.Sequential(*layers)


def checksum(model: nn.Module) -> torch.Tensor:
    """(sum, sum of |p|, p · index) of every parameter in float64: equal across ranks iff (almost surely)
    the parameters are."""
    sums = []
    for p in model.parameters():
        flat = p.detach().double().flatten()
        position = torch.arange(flat.numel(), device=flat.device, dtype=torch.float64)
        sums.append(torch.stack([flat.sum(), flat.abs().sum(), (flat * position).sum()]))
    return torch.stack(sums)


def gathered(tensor: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    parser.add_argument("--activation", choices=["relu", "gelu"], default="gelu")
    parser.add_argument("--widths", default="256,1024,512,64")
    parser.add_argument("--tokens", type=int, default=512, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("no GPU: run with --device cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dtype = getattr(torch, args.dtype)
    widths = [int(w) for w in args.widths.split(",")]

    torch.manual_seed(0)  # the same init everywhere (DDP would broadcast rank 0's anyway)
    reference = mlp(widths, args.activation).to(device, dtype)
    fused = fuse(copy.deepcopy(reference))
    assert isinstance(fused, FusedSequential) and fused.state_dict().keys() == reference.state_dict().keys()
    teacher = nn.Linear(widths[0], widths[-1]).to(device, dtype)  # the targets: a task the MLP can learn
    ids = [local_rank] if cuda else None
    models = {"FusedLinear": DistributedDataParallel(fused, device_ids=ids),
              "nn.Linear": DistributedDataParallel(reference, device_ids=ids)}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for name, m in models.items()}

    def batch(step: int):
        """This rank's shard of step ``step``: different on every rank."""
        generator = torch.Generator(device="cpu").manual_seed(1000 * step + rank)
        x = torch.randn(args.tokens, widths[0], generator=generator).to(device, dtype)
        with torch.no_grad():
            return x, torch.tanh(teacher(x))

    # 1. The all-reduce: each rank's own gradient (no_sync skips it), then DDP's.
    x, y = batch(0)
    ddp = models["FusedLinear"]
    with ddp.no_sync():
        nn.functional.mse_loss(ddp(x).float(), y.float()).backward()
    local = torch.cat([p.grad.double().flatten() for p in fused.parameters()])
    fused.zero_grad(set_to_none=True)
    nn.functional.mse_loss(ddp(x).float(), y.float()).backward()
    synced = torch.cat([p.grad.double().flatten() for p in fused.parameters()])
    fused.zero_grad(set_to_none=True)
    locals_, synceds = gathered(local), gathered(synced)
    ranks_differ = not torch.equal(locals_[0], locals_[1 % world])
    mean = torch.stack(locals_).mean(0)
    close = {"rtol": 2e-2, "atol": 1e-2 * mean.abs().max().item()} if dtype == torch.bfloat16 else \
        {"rtol": 1e-5, "atol": 1e-7}  # DDP sums in the gradients' dtype
    all_reduced = all(torch.equal(s, synceds[0]) for s in synceds) and bool(torch.allclose(synced, mean, **close))

    # 2. Training: both models, step by step on the same shards; replicas checked every step.
    losses: dict[str, list[float]] = {name: [] for name in models}
    identical = True
    for step in range(args.steps):
        x, y = batch(step + 1)
        for name, model in models.items():
            optimizers[name].zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x).float(), y.float())
            loss.backward()
            optimizers[name].step()
            total = loss.detach().double().reshape(1)
            dist.all_reduce(total)
            losses[name].append(total.item() / world)
            sums = gathered(checksum(model.module))
            identical &= all(torch.equal(s, sums[0]) for s in sums)

    worst = max(abs(a - b) / abs(b) for a, b in zip(losses["FusedLinear"], losses["nn.Linear"]))
    matches = worst < TOLERANCE[args.dtype]
    if rank == 0:
        print(f"{world} ranks ({dist.get_backend()}, {device.type}), {args.dtype}, MLP {args.widths} "
              f"{args.activation}, {args.tokens} samples per rank per step")
        print(f"gradients before the all-reduce differ between ranks: {ranks_differ}")
        print(f"gradients all-reduced (every rank holds the mean of the ranks' own): {all_reduced}")
        print(f"{'step':>4}  {'FusedLinear':>12}  {'nn.Linear':>12}  relative difference")
        for step, (a, b) in enumerate(zip(losses["FusedLinear"], losses["nn.Linear"])):
            if step % 5 == 0 or step == args.steps - 1:
                print(f"{step:>4}  {a:12.6f}  {b:12.6f}  {abs(a - b) / abs(b):.1e}")
        print(f"loss falls: {losses['FusedLinear'][-1] < losses['FusedLinear'][0]}")
        print(f"replicas identical at every step: {identical}")
        print(f"loss curves match nn.Linear (worst relative difference {worst:.1e} < {TOLERANCE[args.dtype]}): "
              f"{matches}")
    dist.barrier()  # no rank tears gloo down while another still uses it (seen once: rank 1 aborted at exit)
    dist.destroy_process_group()
    ok = ranks_differ and all_reduced and identical and matches and losses["FusedLinear"][-1] < losses["FusedLinear"][0]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
