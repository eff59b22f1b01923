"""Probe (GPU, cuBLASLt 13.4+): what cuBLASLt's grouped mode supports beyond a plain GEMM.

For each epilog, in the experts' forward form (2-D tokens × 3-D weights, ragged M, TN), ask the
heuristics for algorithms. Where some are offered for a bias epilog, run them with the bias pointer
given two ways — one vector shared by all groups, and a device array of per-group pointers — and
compare each group with a float64 reference, to learn which one cuBLASLt reads. Also: fp8 E4M3
operands with per-tensor scales, float32 operands, and the TN / NN / NT layouts. What it finds decides
which epilogs ``grouped_matmul`` offers (issue 24).

    NVBLASLT_LIBRARY=/tmp/lt/libcublasLt.so.13 python -m tools.probe_grouped_epilogs
"""

from __future__ import annotations

import torch

import nvblaslt
from nvblaslt import GroupedMatmul, MatmulEpilog

G, K, N = 4, 256, 384
SIZES = [64, 0, 192, 128]


def _case(dtype=torch.bfloat16, transposed=True):
    torch.manual_seed(0)
    x = torch.randn(sum(SIZES), K, device="cuda").to(dtype)
    w = (torch.randn(G, N, K, device="cuda") / K ** 0.5).to(dtype)
    b = w.transpose(1, 2) if transposed else w.transpose(1, 2).contiguous()
    offs = torch.tensor(SIZES, device="cuda").cumsum(0).to(torch.int32)
    return x, b, offs


def _reference(x, b, offs, bias=None, relu=False):
    ends = offs.tolist()
    out = []
    for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends)):
        y = x[s:e].double() @ b[g].double()
        if bias is not None:
            y = y + bias[g].double()
        out.append(torch.relu(y) if relu else y)
    return torch.cat(out)


def offered(plan) -> tuple[int, str]:
    """How many algorithms the heuristics offer, and cuBLASLt's status where it refuses."""
    try:
        return len(plan.plan(limit=8)), "CUBLAS_STATUS_SUCCESS"
    except nvblaslt.CublasLtError as error:
        return 0, error.status_name


def main() -> None:
    lib = nvblaslt.library()
    print(f"{torch.cuda.get_device_name()}, cuBLASLt {lib.version_tuple}")
    x, b, offs = _case()
    for name, epilog in MatmulEpilog.__members__.items():
        plan = GroupedMatmul(x, b, offs)
        plan._launch.desc.set("EPILOGUE", int(epilog))
        bias_like = "BIAS" in name or "BGRAD" in name
        if bias_like and "BGRAD" not in name:
            plan._launch.desc.set("BIAS_DATA_TYPE", int(lib.api.CUDA_R_16BF))
        count, status = offered(plan)
        print(f"{name:24s} algorithms offered: {count} ({status})")
        plan.free()
    # bias: which pointer does cuBLASLt read in grouped mode?
    bias = torch.randn(G, N, device="cuda", dtype=torch.bfloat16)
    pointers = torch.tensor([bias[g].data_ptr() for g in range(G)], device="cuda", dtype=torch.int64)
    for how, pointer in (("shared vector (group 0's)", bias.data_ptr()), ("array of per-group pointers",
                                                                           pointers.data_ptr())):
        plan = GroupedMatmul(x, b, offs)
        plan._launch.desc.set("EPILOGUE", int(MatmulEpilog.BIAS))
        plan._launch.desc.set("BIAS_DATA_TYPE", int(lib.api.CUDA_R_16BF))
        plan._launch.desc.set("BIAS_POINTER", pointer)
        plan._launch.desc.set("BIAS_BATCH_STRIDE", N)
        count, status = offered(plan)
        if not count:
            print(f"BIAS with {how}: no algorithm ({status})")
            continue
        out = plan.execute(check_offsets=True)
        torch.cuda.synchronize()
        per_group = _reference(x, b, offs, bias)
        shared = _reference(x, b, offs, bias[0].expand(G, N))
        scale = per_group.abs().max().item()
        print(f"BIAS with {how}: error vs per-group bias {((out.double() - per_group).abs().max() / scale):.2e}, "
              f"vs group 0's bias for all {((out.double() - shared).abs().max() / scale):.2e}")
        plan.free()
    for label, dtype, transposed in (("float32", torch.float32, True), ("NN (weights (G, K, N))", torch.bfloat16,
                                                                       False), ("float16 TN", torch.float16, True)):
        try:
            xx, bb, oo = _case(dtype, transposed)
            out = nvblaslt.grouped_matmul(xx, bb, oo, check_offsets=True)
            torch.cuda.synchronize()
            error = ((out.double() - _reference(xx, bb, oo)).abs().max() / out.double().abs().max()).item()
            print(f"{label}: runs, max error {error:.2e}")
        except nvblaslt.NvblasltError as error:
            print(f"{label}: {type(error).__name__}: {error}")


if __name__ == "__main__":
    main()
