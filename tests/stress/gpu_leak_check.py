"""Leak check (GPU): N plan create/execute/release cycles; host RSS and device memory must not grow.
Released with free(), or (--collect) only by dropping the object, which leaves descriptors and workspace
to the garbage collector's finalizers. Summary, last line:

    gpu_leak_check: N cycles (free()|dropped): L leaks

    python -m tests.stress.gpu_leak_check [cycles] [--collect]      # from the repository root; 100000 cycles
    python -m pytest -m stress tests      # a short run of each mode (test_leak_check.py)

Exit status 1 on a leak.
"""

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
    mode = "dropped" if collect else "free()"
    print(f"{cycles} cycles ({mode}): host RSS {rss0:.1f} -> {rss1:.1f} MiB ({rss1 - rss0:+.2f}); "
          f"device free {free0 / 2**20:.0f} -> {free1 / 2**20:.0f} MiB ({(free1 - free0) / 2**20:+.1f})")
    leaks = [what for what, grew in (("host RSS", rss1 - rss0 >= 1.0), ("device memory", free0 - free1 >= 1 << 20))
             if grew]
    print(f"gpu_leak_check: {cycles} cycles ({mode}): {len(leaks)} leaks" + (f" ({', '.join(leaks)})" if leaks else ""))
    return 1 if leaks else 0


if __name__ == "__main__":
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    sys.exit(main(int(numbers[0]) if numbers else 100_000, "--collect" in sys.argv))
