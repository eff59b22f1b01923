"""Probe (GPU, cuBLASLt 13.4+): does cuBLASLt's grouped mode run fp8 (E4M3) operands, with and without
per-tensor scales, in the experts' forward form (2-D tokens × 3-D weights, ragged M)?

nvblaslt's grouped problem takes bfloat16 and float16 operands only; this probe widens that for
itself (E4M3 in, float32 out, the layouts the bf16 path uses), asks the heuristics, and where they offer
algorithms runs the first and compares every group with a float64 reference of the dequantised values.
What it finds decides whether ``grouped_matmul`` takes fp8 (issue 24).

    NVBLASLT_LIBRARY=/tmp/lt/libcublasLt.so.13 python -m tools.probe_grouped_fp8
"""

from __future__ import annotations

import torch

import nvblaslt
from nvblaslt import GroupedMatmul, _dtypes, _grouped_problem

G, K, N = 4, 256, 384
SIZES = [64, 0, 192, 128]


def main() -> None:
    lib = nvblaslt.library()
    print(f"{torch.cuda.get_device_name()}, cuBLASLt {lib.version_tuple}")
    _grouped_problem.INPUT_TYPES = (*_grouped_problem.INPUT_TYPES, _dtypes.FLOAT8_E4M3)  # this probe only
    torch.manual_seed(0)
    offs = torch.tensor(SIZES, device="cuda").cumsum(0).to(torch.int32)
    x = torch.randn(sum(SIZES), K, device="cuda").to(torch.float8_e4m3fn)
    w = (torch.randn(G, N, K, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    scale_a = torch.tensor([0.5], device="cuda")
    scale_b = torch.tensor([4.0], device="cuda")  # a product of 2: a scale left unread shows
    for layout, b in (("TN (weights (G, N, K), as nn.Linear keeps them)", w.transpose(1, 2)),
                      ("NN (weights (G, K, N) row-major)", w.transpose(1, 2).contiguous())):
        for scaled in (False, True):
            label = f"E4M3 {layout}, {'per-tensor scales' if scaled else 'no scales'}, float32 out"
            try:
                plan = GroupedMatmul(x, b, offs, out_dtype=torch.float32)
            except nvblaslt.NvblasltError as error:
                print(f"{label}: refused before cuBLASLt: {type(error).__name__}: {error}")
                continue
            if scaled:  # cuBLASLt's A is the caller's b, its B the caller's a
                plan.desc.set("A_SCALE_POINTER", scale_b.data_ptr())
                plan.desc.set("B_SCALE_POINTER", scale_a.data_ptr())
            try:
                count = len(plan.plan(limit=8))
            except nvblaslt.CublasLtError as error:
                print(f"{label}: no algorithm ({error.status_name})")
                plan.free()
                continue
            out = plan.execute(check_offsets=True)
            torch.cuda.synchronize()
            ends = offs.tolist()
            want = torch.cat([x[s:e].double() @ b[g].double() for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends))])
            if scaled:
                want = want * scale_a.item() * scale_b.item()
            error = ((out.double() - want).abs().max() / want.abs().max()).item()
            print(f"{label}: {count} algorithms offered; the first runs, max error {error:.2e} "
                  f"(NaN: {bool(torch.isnan(out).any())})")
            plan.free()


if __name__ == "__main__":
    main()
