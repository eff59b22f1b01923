/* nvblaslt stub: 16-bit float storage type. */
#pragma once
typedef struct { unsigned short x; } __half;
