"""cuBLASLt at the descriptor level: a handle, a matmul descriptor with a RELU_BIAS epilogue,
matrix layouts, a preference, the heuristic, and cublasLtMatmul itself, called through the
generated C API (nvblaslt.lt). Operands are plain PyTorch tensors read by pointer.

    python examples/descriptor_level.py      (needs an NVIDIA GPU and PyTorch)
"""

import ctypes
import sys

try:
    import torch
except ImportError:
    sys.exit("this example needs PyTorch")
import nvblaslt

try:  # a GPU, a driver and a cuBLASLt nvblaslt can use: asked before any array is made on the GPU
    nvblaslt.Handle.for_device(0)
except nvblaslt.NvblasltError as missing:
    sys.exit(f"this example needs an NVIDIA GPU, its driver and cuBLASLt: {missing}")
if not torch.cuda.is_available():
    sys.exit("this example needs PyTorch with CUDA (torch.cuda.is_available() is False)")

from nvblaslt import lt

m, n, k = 512, 384, 256
# cuBLASLt is column-major: a (m, k) column-major matrix is a transposed (k, m) row-major tensor.
a = torch.randn(k, m, device="cuda").t()
b = torch.randn(n, k, device="cuda").t()
bias = torch.randn(m, device="cuda")
d = torch.empty(n, m, device="cuda").t()

handle = nvblaslt.Handle.for_device(0)
with nvblaslt.MatmulDesc(lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F) as desc, \
        nvblaslt.MatrixLayout(lt.CUDA_R_32F, m, k, m) as a_layout, \
        nvblaslt.MatrixLayout(lt.CUDA_R_32F, k, n, k) as b_layout, \
        nvblaslt.MatrixLayout(lt.CUDA_R_32F, m, n, m) as d_layout, \
        nvblaslt.MatmulPreference(max_workspace_bytes=32 << 20) as preference:
    desc.set(lt.CUBLASLT_MATMUL_DESC_EPILOGUE, lt.CUBLASLT_EPILOGUE_RELU_BIAS)  # typed: packs a uint32
    desc.set("BIAS_POINTER", bias.data_ptr())
    print("descriptor:", {name: value for name, value in desc.attributes().items()
                          if name in ("COMPUTE_TYPE", "EPILOGUE", "BIAS_POINTER", "TRANSA", "TRANSB")})

    results = nvblaslt.heuristics(handle, desc, a_layout, b_layout, d_layout, d_layout, preference, count=4)
    for result in results:
        print(" ", result)
    best = results[0]
    print("algorithm config:", best.algorithm.config())
    print("tiles this algorithm id offers:", len(best.algorithm.capability("TILE_IDS")))

    workspace = torch.empty(max(best.workspace_size, 1), dtype=torch.uint8, device="cuda")
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    lt.cublasLtMatmul(handle.handle, desc.handle, ctypes.byref(alpha), a.data_ptr(), a_layout.handle,
                      b.data_ptr(), b_layout.handle, ctypes.byref(beta), d.data_ptr(), d_layout.handle,
                      d.data_ptr(), d_layout.handle, ctypes.byref(best.algorithm.algo), workspace.data_ptr(),
                      best.workspace_size, torch.cuda.current_stream().cuda_stream)
torch.cuda.synchronize()
expected = torch.relu(a.double() @ b.double() + bias.double()[:, None])
error = ((d.double() - expected).norm() / expected.norm()).item()
print(f"cublasLtMatmul with RELU_BIAS: relative error {error:.2e} against float64")
assert error < 1e-5
