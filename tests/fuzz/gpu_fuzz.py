"""GPU fuzz (run on a GPU machine): random matmul calls with real arrays, valid and invalid mixed.

Every call must either be refused with an nvblaslt error, or be accepted and agree with a float64
reference; anything else (another exception, a wrong result, a crash of this process) is a failure.
Summary line:

    gpu_fuzz: N calls in T s (seed S): A accepted and correct, R invalid calls refused, F failures; ...

    python -m tests.fuzz.gpu_fuzz [calls] [seed]      # from the repository root; 10000 calls, seed 0
    python -m pytest -m fuzz tests      # a smoke run at a fixed seed (test_gpu_fuzz.py), and the CPU fuzz

Exit status 1 on any failure.
"""

from __future__ import annotations

import collections
import warnings
import sys
import time

import numpy as np
import torch

import nvblaslt
from nvblaslt import MatmulEpilog, NvblasltError, matmul
from tests.reference import gelu, gelu_grad, host, rel_error

warnings.filterwarnings("ignore", message="epilog_inputs: .* ignoring")

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float64: 1e-8}


class Case:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.valid = True  # cleared by every injected fault; None: nvmath-python's rule allows either outcome

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def tensor(self, shape, dtype, layout=None):
        layout = layout or ("row" if self.chance(0.5) else "col")
        stored = shape if layout == "row" or len(shape) < 2 else (*shape[:-2], shape[-1], shape[-2])
        t = torch.from_numpy(self.rng.standard_normal(stored)).to(dtype).cuda()
        return t if layout == "row" or len(shape) < 2 else t.transpose(-1, -2)

    def fault(self, good, *bad):
        """``good``, or (rarely) one of the bad alternatives, marking the call invalid."""
        if bad and self.chance(0.08):
            self.valid = False
            return bad[self.rng.integers(len(bad))]()
        return good


def describe(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}/{tuple(value.stride())}/{str(value.dtype)[6:]}/{value.device}"
    return repr(value)


def one_call(rng: np.random.Generator, stats: collections.Counter) -> None:
    case = Case(rng)
    dtype = [torch.float32, torch.float16, torch.bfloat16, torch.float64][rng.integers(4)]
    m, n, k = (int(x) for x in rng.integers(1, 72, size=3))
    batch = () if case.chance(0.7) else (int(rng.integers(1, 4)),)
    epilog = list(MatmulEpilog)[rng.integers(16)]
    bgrad_layouts = {MatmulEpilog.BGRADA: ("col", None), MatmulEpilog.BGRADB: (None, "row")}.get(epilog, (None, None))
    a = case.tensor((*batch, m, k), dtype, bgrad_layouts[0])
    b_batch = batch if case.chance(0.8) else ()  # a 2-D b broadcasts over a's batch
    b = case.tensor((*b_batch, k, n), dtype, bgrad_layouts[1])
    a = case.fault(a, lambda: a.cpu(), lambda: [[1.0]], lambda: case.tensor((m, k + 1), dtype),
                   lambda: a.to(torch.float32 if dtype != torch.float32 else torch.float16), lambda: None)
    inputs = {}
    if "BIAS" in epilog.name and not epilog.name.endswith("BGRAD"):
        bias = case.tensor((m,), dtype)
        inputs["bias"] = case.fault(bias, lambda: case.tensor((m + 1,), dtype), lambda: bias.cpu(),
                                    lambda: case.tensor((1, 1, m), dtype))
    forward_z = None
    if epilog.name.startswith(("DRELU", "DGELU")):  # the aux comes from a real forward pass of the same M, N
        if k == 1:
            case.valid = False  # refused: cuBLASLt's DRELU/DGELU read out of bounds at K=1
        x, w, fb = case.tensor((*batch, m, 8), dtype), case.tensor((8, n), dtype), case.tensor((m,), dtype)
        kind = "relu_aux" if "RELU" in epilog.name else "gelu_aux"
        _, aux = matmul(x, w, epilog=f"{kind.split('_')[0].upper()}_AUX_BIAS", epilog_inputs={"bias": fb})
        forward_z = host(x) @ host(w) + host(fb)[:, None]
        inputs[kind] = case.fault(aux[kind], lambda: aux[kind][..., :-1, :] if aux[kind].shape[-2] > 1 else None,
                                  lambda: aux[kind].transpose(-1, -2), lambda: aux[kind].cpu())
    if inputs and case.chance(0.04):  # a key the epilog does not take: refused, as nvmath-python 1.0 refuses it
        inputs["unknown"] = inputs[next(iter(inputs))]
        case.valid = False
    kwargs = {"epilog": case.fault(epilog, lambda: "NOT_AN_EPILOG", lambda: 12345, lambda: 2.5)}
    if inputs:
        kwargs["epilog_inputs"] = inputs
    alpha = float(rng.uniform(-2, 2))
    kwargs["alpha"] = case.fault(alpha, lambda: "two", lambda: [1.0], lambda: object())  # (alpha=None means 1)
    if case.chance(0.1):
        kwargs["beta"] = 0.5  # without c: nvmath-python ignores it with a warning; refusing is fine too
        if case.valid:
            case.valid = None
    try:
        result = matmul(a, b, **kwargs)
    except NvblasltError as error:
        if case.valid is None:
            stats["refused"] += 1
            return
        if case.valid:  # a well-formed call the library has no kernel for: say which
            stats[f"no kernel: {epilog.name} {str(dtype)[6:]} {'batched' if batch else '2-D'}"] += 1
            if not isinstance(error, nvblaslt.CublasLtError):
                raise AssertionError(f"refused a valid call: {error}") from error
        else:
            stats["refused"] += 1
        return
    if case.valid is False:
        raise AssertionError(f"accepted an invalid call: {epilog.name}, a {describe(a)}, b {describe(b)}, "
                             + ", ".join(f"{k}={describe(v)}" for k, v in kwargs.items()))
    d, aux = result if isinstance(result, tuple) else (result, {})
    z = alpha * (host(a) @ host(b))
    if "bias" in inputs:
        z = z + host(inputs["bias"])[:, None]
    name = epilog.name
    expected = {"RELU": np.maximum(z, 0), "GELU": gelu(z)}.get(name.split("_")[0], z)
    if name.startswith("DRELU"):
        decided = np.abs(forward_z) > 1e-2 * np.abs(forward_z).max()
        expected = np.where(decided, z * (forward_z > 0), host(d))
    elif name.startswith("DGELU"):
        expected = z * gelu_grad(host(inputs["gelu_aux"])[..., :m, :])
    tolerance = 3 * TOL[dtype]
    error = rel_error(host(d), expected)
    if error > tolerance:
        raise AssertionError(f"{name} {dtype} M={m} N={n} K={k} batch={batch}: relative error {error:.2e}")
    stats["accepted and correct"] += 1


def main(calls: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    stats: collections.Counter = collections.Counter()
    failures = []
    start = time.perf_counter()
    for index in range(calls):
        try:
            one_call(rng, stats)
        except Exception as exc:  # a failure of nvblaslt: not an nvblaslt error, or a wrong result
            failures.append(f"call {index}: {type(exc).__name__}: {exc}")
        if (index + 1) % 2000 == 0:
            print(f"  {index + 1} calls, {len(failures)} failures", flush=True)
    nvblaslt.clear_plan_cache()
    print(f"gpu_fuzz: {calls} calls in {time.perf_counter() - start:.0f} s (seed {seed}): "
          f"{stats['accepted and correct']} accepted and correct, {stats['refused']} invalid calls refused, "
          f"{len(failures)} failures; 0 crashes (this process is still alive)")
    for key, count in sorted(stats.items()):
        if key.startswith("no kernel"):
            print(f"  {key}: {count}")
    for failure in failures[:20]:
        print("  FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000, int(sys.argv[2]) if len(sys.argv) > 2 else 0))
