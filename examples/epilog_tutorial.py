"""Epilog tutorial: the seed notebook's cells, run on nvblaslt with only the import changed.

    python examples/epilog_tutorial.py          (needs an NVIDIA GPU and CuPy)
"""

import sys

try:
    import cupy
except ImportError:
    sys.exit("this example needs CuPy and an NVIDIA GPU")
import nvblaslt

try:  # a GPU, a driver and a cuBLASLt nvblaslt can use: asked before any array is made on the GPU
    nvblaslt.Handle.for_device(0)
except nvblaslt.NvblasltError as missing:
    sys.exit(f"this example needs an NVIDIA GPU, its driver and cuBLASLt: {missing}")

from nvblaslt import MatmulEpilog as Epilog
from nvblaslt import matmul

print(", ".join(e.name for e in Epilog))
print()

# RELU
a = cupy.asarray([[1, 2], [3, -4]], dtype=cupy.float32)
b = cupy.asarray([[5, -6], [7, -8]], dtype=cupy.float32)

print("A @ B:")
print(matmul(a, b))
print()
print("relu(A @ B):")
print(matmul(a, b, epilog=Epilog.RELU))
print()

# BIAS
a = cupy.asarray(cupy.ones((3, 5)), dtype=cupy.float32)
b = cupy.asarray(cupy.ones((5, 4)), dtype=cupy.float32)
bias = cupy.asarray([0, 10, 20], dtype=cupy.float32)

print("a @ b:")
print(matmul(a, b))
print()
print("a @ b + bias:")
print(matmul(a, b, epilog=Epilog.BIAS, epilog_inputs={"bias": bias}))
print()

# RELU_BIAS
a = cupy.asarray([[1, 2], [3, -4]], dtype=cupy.float32)
b = cupy.asarray([[5, -6], [7, -8]], dtype=cupy.float32)
bias = cupy.asarray([-10, 10], dtype=cupy.float32)

print("a @ b:")
print(matmul(a, b))
print()
print("a @ b + bias:")
print(matmul(a, b, epilog=Epilog.BIAS, epilog_inputs={"bias": bias}))
print()
print("relu(a @ b + bias):")
print(matmul(a, b, epilog=Epilog.RELU_BIAS, epilog_inputs={"bias": bias}))
print()

# RELU_AUX
a = cupy.asarray([[1, 2], [3, -4]], dtype=cupy.float32)
b = cupy.asarray([[5, -6], [7, -8]], dtype=cupy.float32)

print("a @ b:")
print(matmul(a, b))
print()

print("relu(a @ b):")
result, aux = matmul(a, b, epilog=Epilog.RELU_AUX)  # Note that a tuple is returned!
print(result)
print()

print("aux is a", type(aux), "with the following keys:", aux.keys())
print("aux[relu_aux] is", type(aux["relu_aux"]), "with dtype", aux["relu_aux"].dtype)
