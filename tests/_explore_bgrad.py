import torch, nvblaslt
from nvblaslt import matmul, CublasLtError
def t(shape, layout, dtype):
    s = shape if layout=="row" else shape[::-1]
    x = torch.randn(*s, device="cuda", dtype=dtype)
    return x if layout=="row" else x.t()
for which in ("BGRADA","BGRADB"):
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for la in ("row","col"):
            for lb in ("row","col"):
                a, b = t((96,40), la, dt), t((40,48), lb, dt)
                try:
                    d, aux = matmul(a, b, epilog=which); r="ok"
                    exp = a.double().sum(1) if which=="BGRADA" else b.double().sum(0)
                    err = ((aux[which.lower()].double()-exp).norm()/exp.norm()).item(); r=f"ok err={err:.1e}"
                except CublasLtError as e: r = e.status_name
                print(which, dt, la, lb, r)
