/* nvblaslt stub: only the opaque FILE type. */
#pragma once
#include <stddef.h>
typedef struct _IO_FILE FILE;
