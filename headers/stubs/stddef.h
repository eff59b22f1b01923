/* nvblaslt stub: size_t and NULL for pycparser. */
#pragma once
typedef unsigned long size_t;
typedef long ptrdiff_t;
#define NULL ((void*)0)
