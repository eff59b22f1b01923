/* nvblaslt stub: bfloat16 storage type. */
#pragma once
typedef struct { unsigned short x; } __nv_bfloat16;
