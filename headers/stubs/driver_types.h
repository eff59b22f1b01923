/* nvblaslt stub: the CUDA runtime types cuBLAS headers refer to. */
#pragma once
#include <stddef.h>
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
