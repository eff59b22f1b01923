"""Leak check (run by hand on a GPU machine): N plan create/execute/release cycles; host RSS and
device memory must not grow. Released with free(), or (--collect) only by dropping the object,
which leaves descriptors and workspace to the garbage collector's finalizers.

    PYTHONPATH=. python3 tests/gpu_leak_check.py [cycles] [--collect]"""

import gc
import os
import sys

import torch

from nvblaslt import Matmul


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(cycles: int, collect: bool) -> int:
    a, b = torch.randn(64, 32, device="cuda"), torch.randn(32, 48, device="cuda")
    bias = torch.randn(64, device="cuda")

    def cycle():
        mm = Matmul(a, b)
        mm.plan(epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
        mm.execute()
        if not collect:
            mm.free()

    for _ in range(2000):  # warm-up: caches, pools, lazy module state
        cycle()
    torch.cuda.synchronize()
    gc.collect()
    rss0, free0 = rss_mib(), torch.cuda.mem_get_info()[0]
    for _ in range(cycles):
        cycle()
    torch.cuda.synchronize()
    gc.collect()
    rss1, free1 = rss_mib(), torch.cuda.mem_get_info()[0]
    print(f"{cycles} cycles ({'dropped' if collect else 'free()'}): host RSS {rss0:.1f} -> {rss1:.1f} MiB ({rss1 - rss0:+.2f}); "
          f"device free {free0 / 2**20:.0f} -> {free1 / 2**20:.0f} MiB ({(free1 - free0) / 2**20:+.1f})")
    return 0 if rss1 - rss0 < 1.0 and free0 - free1 < 1 << 20 else 1


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    sys.exit(main(int(numbers[0]) if numbers else 100_000, "--collect" in sys.argv))
