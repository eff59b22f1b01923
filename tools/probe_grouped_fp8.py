"""Probe (GPU, cuBLASLt 13.4+): does cuBLASLt's grouped mode run fp8 (E4M3) operands, with and without
per-tensor scales, in the experts' forward form (2-D tokens × 3-D weights, ragged M)? Then: E5M2 in
either operand, and the scale modes beyond per-tensor (row-wise ``OUTER_VEC_32F``, 1×128 blocks
``VEC128_32F``, 128×128 blocks ``BLK128x128_32F``): offered, run, and applied? Each such mode first
runs with every scale 2 (whatever their layout, the result must double twice), then with row-wise
scales that differ per token and per output feature, against the layout a dense GEMM would use (a
contiguous vector over all groups' rows; the weights' per group).

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
                plan._launch.desc.set("A_SCALE_POINTER", scale_b.data_ptr())
                plan._launch.desc.set("B_SCALE_POINTER", scale_a.data_ptr())
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
    e5m2_pairs(x, w, offs)
    scale_modes(x, w, offs)


def _reference(a, b, offs):
    ends = offs.tolist()
    return torch.cat([a[s:e].double() @ b[g].double() for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends))])


def _error(out, want) -> str:
    return f"max error {((out.double() - want).abs().max() / want.abs().max()).item():.2e}, NaN {bool(torch.isnan(out).any())}"


def _planned(plan, label: str, configure) -> int | None:
    """``configure()`` (it sets the plan up), then the heuristics: how many algorithms they offer, or None (said why; plan freed)."""
    try:
        configure()
        return len(plan.plan(limit=8))
    except nvblaslt.CublasLtError as error:
        print(f"{label}: no algorithm or refused ({error.status_name})")
        plan.free()
        return None


def e5m2_pairs(x, w, offs) -> None:
    """E5M2 in a, in b, in both (a gradient's dtype in fp8 training), TN, float32 out. nvblaslt's problem
    takes one fp8 dtype for both: the plan is made for E4M3 and the layouts' TYPE then set to E5M2, the
    operands' bytes passed as they are (cuBLASLt's A is the caller's b, its B the caller's a)."""
    e5m2 = int(nvblaslt.library().api.CUDA_R_8F_E5M2)
    for a_type, b_type in ((torch.float8_e5m2, torch.float8_e4m3fn), (torch.float8_e4m3fn, torch.float8_e5m2),
                           (torch.float8_e5m2, torch.float8_e5m2)):
        a, b = x.float().to(a_type), w.float().to(b_type).transpose(1, 2)
        label = f"{str(a_type)[6:]} a × {str(b_type)[6:]} b, TN, float32 out"
        bits = [t.view(torch.float8_e4m3fn) if t.dtype == torch.float8_e5m2 else t for t in (a, b)]
        plan = GroupedMatmul(bits[0], bits[1], offs, out_dtype=torch.float32)

        def retype(plan=plan, a_type=a_type, b_type=b_type) -> None:
            if a_type == torch.float8_e5m2:
                plan._launch.layouts[1].set("TYPE", e5m2)
            if b_type == torch.float8_e5m2:
                plan._launch.layouts[0].set("TYPE", e5m2)
        count = _planned(plan, label, retype)
        if count is None:
            continue
        out = plan.execute(check_offsets=True)
        torch.cuda.synchronize()
        print(f"{label}: {count} algorithms; {_error(out, _reference(a, b, offs))}")
        plan.free()


def scale_modes(x, w, offs) -> None:
    api = nvblaslt.library().api
    b = w.transpose(1, 2)
    want = _reference(x, b, offs)
    rows, groups = x.shape[0], w.shape[0]
    # last: with 13.8.2 on an H200, VEC128_32F is planned and then faults (illegal address), ending the process
    for mode in ("OUTER_VEC_32F", "BLK128x128_32F", "VEC128_32F"):
        value = int(getattr(api, f"CUBLASLT_MATMUL_MATRIX_SCALE_{mode}"))
        plan = GroupedMatmul(x, b, offs, out_dtype=torch.float32)
        twos = torch.full((1 << 20,), 2.0, device="cuda")  # more than any layout of these scales needs

        def scaled(plan=plan, value=value, twos=twos) -> None:
            for name in ("A", "B"):
                plan._launch.desc.set(f"{name}_SCALE_MODE", value)
                plan._launch.desc.set(f"{name}_SCALE_POINTER", twos.data_ptr())
        count = _planned(plan, f"scale mode {mode}", scaled)
        if count is None:
            continue
        out = plan.execute(check_offsets=True)
        torch.cuda.synchronize()
        print(f"scale mode {mode}: {count} algorithms; every scale 2: {_error(out, want * 4)}")
        if mode == "OUTER_VEC_32F":  # cuBLASLt's A is the weights (a scale per output feature, per group?),
            # its B the tokens (a scale per token row)
            token_scale = torch.rand(rows, device="cuda") + 0.5
            feature_scale = torch.rand(groups, w.shape[1], device="cuda") + 0.5
            plan._launch.desc.set("A_SCALE_POINTER", feature_scale.data_ptr())
            plan._launch.desc.set("B_SCALE_POINTER", token_scale.data_ptr())
            out = plan.execute(check_offsets=True)
            torch.cuda.synchronize()
            ends = offs.tolist()
            per_group = torch.cat([feature_scale[g].expand(e - s, -1) for g, (s, e) in
                                   enumerate(zip([0, *ends[:-1]], ends))])
            hypothesis = want * token_scale[:, None].double() * per_group.double()
            shared = want * token_scale[:, None].double() * feature_scale[0][None, :].double()
            print(f"  row-wise, per token and per group's output feature: {_error(out, hypothesis)}; "
                  f"one feature vector for every group: {_error(out, shared)}")
        plan.free()


if __name__ == "__main__":
    main()
