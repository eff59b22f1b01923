import time, torch, nvblaslt
from nvblaslt import Matmul, _search
from collections import Counter
m,k,n = 65536,16384,8192
a=torch.randn(m,k,device='cuda',dtype=torch.float16); b=torch.randn(k,n,device='cuda',dtype=torch.float16)
bias=torch.randn(m,device='cuda',dtype=torch.float16)
_, aux = nvblaslt.matmul(a,b,epilog='RELU_AUX_BIAS',epilog_inputs={'bias':bias})
for ep, inp in (('DEFAULT',None),('RELU_AUX_BIAS',{'bias':bias}),('DRELU_BGRAD',{'relu_aux':aux['relu_aux']})):
    mm=Matmul(a,b); h=mm.plan(epilog=ep, epilog_inputs=inp, preferences={'limit':16})
    t=time.perf_counter(); cfg=_search.configurations(mm, workspace_limit=32<<20); dt=time.perf_counter()-t
    print(ep, 'heuristics', len(h), [r.algorithm.tile for r in h][:8], 'configs', len(cfg), f'{dt:.2f}s')
    print('  ids', Counter(r.algorithm.id for r in cfg))
    print('  tiles', sorted({r.algorithm.tile for r in cfg})[:60])
    print('  has 192x192:', any(r.algorithm.tile=='192x192' for r in cfg), 'waves', sorted({round(r.waves,2) for r in cfg})[:10])
