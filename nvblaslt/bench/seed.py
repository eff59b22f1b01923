"""The ``seed`` section: the seed's fp16 shape (65536×16384×8192), fused epilogs, heuristic #0 and
autotuned, against naive, torch and nvmath-python. Its operands and plans serve the search
section too."""

from __future__ import annotations

import statistics

from .common import epilog_named, free_memory, nvmath_advanced, progress
from .timing import event_rounds

SEED_EPILOGS = ("DEFAULT", "RELU_BIAS", "RELU_AUX_BIAS", "GELU_AUX_BIAS", "DRELU", "DRELU_BGRAD", "DGELU_BGRAD")
QUICK_SEED_EPILOGS = ("DEFAULT", "RELU_BIAS", "RELU_AUX_BIAS", "DRELU_BGRAD")


def operands(torch, args):
    m, k, n = args.m, args.k, args.n
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=generator)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=generator)
    bias = torch.randn(m, device="cuda", dtype=torch.float16, generator=generator)
    return a, b, bias


def epilog_inputs(nvblaslt, a, b, bias) -> dict:
    """Each seed epilog's inputs, the aux arrays made by the forward epilogs."""
    from nvblaslt import MatmulEpilog

    _, aux = nvblaslt.matmul(a, b, epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
    _, gaux = nvblaslt.matmul(a, b, epilog=MatmulEpilog.GELU_AUX_BIAS, epilog_inputs={"bias": bias})
    relu, gelu = {"relu_aux": aux["relu_aux"]}, {"gelu_aux": gaux["gelu_aux"]}
    return {"DEFAULT": None, "RELU_BIAS": {"bias": bias}, "RELU_AUX_BIAS": {"bias": bias},
            "GELU_AUX_BIAS": {"bias": bias}, "DRELU": relu, "DRELU_BGRAD": relu, "DGELU_BGRAD": gelu}


def planned(a, b, name: str, inputs, limit: int):
    from nvblaslt import Matmul

    mm = Matmul(a, b)
    mm.plan(epilog=epilog_named(name), epilog_inputs=inputs, preferences={"limit": limit})
    return mm


def kernel(mm) -> str:
    algorithm = mm.algorithm.algorithm
    return f"id {algorithm.id} {algorithm.tile}"


def section(args, torch, results: dict) -> None:
    import nvblaslt
    from nvblaslt import Matmul

    a, b, bias = operands(torch, args)
    flops = 2.0 * args.m * args.n * args.k
    inputs = epilog_inputs(nvblaslt, a, b, bias)
    cases = []  # (name, fn, note)
    for name in args.seed_epilogs:
        for tuned in (False, True):
            progress(f"seed: planning {name}{' [autotuned]' if tuned else ''}")
            mm = planned(a, b, name, inputs[name], args.limit)
            if tuned:
                mm.autotune(iterations=3, remember=False)
            label = ("plain matmul" if name == "DEFAULT" else f"fused {name}") + (" [autotuned]" if tuned else "")
            cases.append((label, mm.execute, ("autotuned " if tuned else "heuristic #0 ") + kernel(mm)))

    def naive_forward():
        y = nvblaslt.matmul(a, b)
        y += bias[:, None]
        return torch.relu_(y)

    mask = (nvblaslt.matmul(a, b) + bias[:, None]) <= 0

    def naive_backward():
        g = nvblaslt.matmul(a, b)
        g.masked_fill_(mask, 0)
        return g, g.sum(dim=1)

    cases.append(("naive forward (matmul, +bias, relu)", naive_forward, ""))
    cases.append(("naive backward (matmul, mask, bias sum)", naive_backward, ""))
    if "DRELU_BGRAD" in args.seed_epilogs:  # the split form by hand: DRELU, then the row sums as a GEMV
        drelu = planned(a, b, "DRELU", inputs["DRELU"], args.limit)
        ones = torch.ones(args.n, 1, device="cuda", dtype=torch.float16)
        row_sums = Matmul(drelu.execute(), ones)
        row_sums.plan()

        def drelu_then_gemv():
            d = drelu.execute()
            row_sums.reset_operands(a=d)
            return d, row_sums.execute()
        cases.append(("DRELU + row-sum GEMV (2 calls)", drelu_then_gemv, "same outputs as DRELU_BGRAD"))
    cases += nvmath_cases(args, a, b, bias)
    if args.torch:
        bias_n = torch.randn(args.n, device="cuda", dtype=torch.float16)  # torch fuses a bias along N only
        cases.append(("torch.matmul", lambda: torch.matmul(a, b), ""))
        cases.append(("torch._addmm_activation", lambda: torch._addmm_activation(bias_n, a, b),
                      "relu(a @ b + bias along N), torch's fused path"))
        if args.compile:
            progress("seed: compiling relu(a @ b + bias) with torch.compile")
            compiled = torch.compile(lambda x, y, z: torch.relu(x @ y + z[:, None]))
            for _ in range(3):
                compiled(a, b, bias)
            cases.append(("torch.compile relu(a @ b + bias)", lambda: compiled(a, b, bias), ""))
    progress(f"seed: timing {len(cases)} cases, {args.repeats} interleaved rounds")
    samples = event_rounds(torch, [(name, fn) for name, fn, _ in cases], args.repeats)
    rows = [{"case": name, "ms": statistics.median(s), "tflops": flops / statistics.median(s) / 1e9, "note": note}
            for (name, _, note), s in zip(cases, samples)]
    del cases, inputs
    free_memory(torch)
    results["seed"] = {"shape": [args.m, args.k, args.n], "dtype": "float16", "rounds": args.repeats, "rows": rows,
                       "baseline": "plain matmul"}


def nvmath_cases(args, a, b, bias) -> list:
    advanced = nvmath_advanced()
    if advanced is None:
        progress("seed: nvmath-python not installed: no nvmath rows")
        return []
    epilog = advanced.MatmulEpilog
    _, nvmath_aux = advanced.matmul(a, b, epilog=epilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
    cases = []
    for name, inputs in (("DEFAULT", None), ("RELU_BIAS", {"bias": bias}), ("RELU_AUX_BIAS", {"bias": bias}),
                         ("DRELU_BGRAD", {"relu_aux": nvmath_aux["relu_aux"]})):
        if name not in args.seed_epilogs:
            continue
        for tuned in (False, True):
            progress(f"seed: planning nvmath {name}{' [autotuned]' if tuned else ''}")
            mm = advanced.Matmul(a, b)
            mm.plan(epilog=None if name == "DEFAULT" else epilog[name], epilog_inputs=inputs)
            if tuned:
                mm.autotune(iterations=3)
            cases.append((f"nvmath {'plain' if name == 'DEFAULT' else name}" + (" [autotuned]" if tuned else ""),
                          mm.execute, ""))
    return cases
