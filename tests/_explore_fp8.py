import torch, nvblaslt
from nvblaslt import matmul, CublasLtError
fp8 = torch.float8_e4m3fn
a = (torch.randn(128, 64, device="cuda") * 4).to(fp8)
b = (torch.randn(96, 64, device="cuda") * 4).to(fp8).t()
for rt in ("bfloat16", "float16", "float32"):
    for sc in (None, {"a": 0.5, "b": 0.25}):
        try:
            d = matmul(a, b, quantization_scales=sc, result_type=rt)
            ref = a.float() @ b.float() * (0.125 if sc else 1)
            print(rt, bool(sc), "ok", ((d.float()-ref).norm()/ref.norm()).item())
        except CublasLtError as e: print(rt, bool(sc), e.function, e.status_name)
