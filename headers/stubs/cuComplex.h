/* nvblaslt stub: complex types as plain structs (layout as in CUDA: two packed reals). */
#pragma once
typedef struct { float x, y; } cuFloatComplex;
typedef struct { double x, y; } cuDoubleComplex;
typedef cuFloatComplex cuComplex;
