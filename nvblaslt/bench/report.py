"""The bench's report: the machine it ran on, the compact tables printed last, the chart, and the
files under ``--out`` (bench.json, bench.txt, bench.png)."""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path

from .common import nvmath_advanced


def machine(torch) -> dict:
    import nvblaslt
    from cuda.bindings import runtime as cudart

    _, driver = cudart.cudaDriverGetVersion()
    props = torch.cuda.get_device_properties(0)
    advanced = nvmath_advanced()
    nvmath_version = None
    if advanced is not None:
        import nvmath

        nvmath_version = getattr(nvmath, "__version__", "?")
    return {"gpu": props.name, "driver_cuda": f"{driver // 1000}.{driver % 1000 // 10}",
            "cublaslt": ".".join(map(str, nvblaslt.library().version_tuple)), "torch": torch.__version__,
            "nvmath": nvmath_version, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def summary_lines(results: dict) -> list[str]:
    """The compact tables, for the end of the output."""
    lines = []
    info = results["machine"]
    lines.append(f"nvblaslt bench on {info['gpu']} (CUDA driver {info['driver_cuda']}, cuBLASLt {info['cublaslt']}, "
                 f"torch {info['torch']}, nvmath {info['nvmath'] or '-'}), {info['date']}"
                 f"{', --quick' if results.get('quick') else ''}")
    if "percall" in results:
        section = results["percall"]
        lines += ["", f"per call, host time: {section['problem']} (× bare ctypes cublasLtMatmul; "
                      f"bare vs matmul() max rel. diff {section['bare_matches_matmul']:.1e})"]
        lines += [f"  {r['case']:36s} {r['us_per_call']:8.2f} µs  {r['ratio']:6.2f}×" for r in section["rows"]]
        if section.get("bare_gpu_us"):
            lines.append(f"  (the bare call's kernels alone take {section['bare_gpu_us']:.2f} µs on the GPU)")
        lines.append("  matmul()'s host time by function (cProfile, µs per call, inflated alike):")
        lines += [f"    {r['us']:6.2f}  {r['function']}" for r in section["profile"][:6]]
    if "layer" in results:
        rows = results["layer"]["rows"]
        cases = list(dict.fromkeys(r["case"] for r in rows))[1:]
        short = {"nvblaslt matmul()": "matmul()", "nvblaslt Matmul.execute()": "execute()",
                 "nvmath Matmul.execute()": "nvmath exec", "nn.Linear + activation": "nn.Linear+a",
                 "nvblaslt.torch.linear": "torch.linear"}
        lines += ["", "layers, bf16, event time per call: torch _addmm_activation in µs, the others × torch "
                      "(< 1 is faster)",
                  f"  {'tokens':>6s} {'in->out':>11s} {'epilog':9s} {'torch µs':>9s} " +
                  " ".join(f"{short.get(c, c):>11s}" for c in cases)]
        for key in dict.fromkeys((r["tokens"], r["in"], r["out"], r["epilog"]) for r in rows):
            group = {r["case"]: r for r in rows if (r["tokens"], r["in"], r["out"], r["epilog"]) == key}
            cells = " ".join(f"{group[c]['ratio']:11.3f}" if c in group else f"{'-':>11s}" for c in cases)
            lines.append(f"  {key[0]:6d} {f'{key[1]}->{key[2]}':>11s} {key[3]:9s} "
                         f"{group['torch _addmm_activation']['us']:9.1f} {cells}")
    if "graph" in results:
        lines += ["", f"decode under CUDA-graph replay, bf16, GPU µs per layer (a graph of {results['graph']['layers']} "
                      f"layers): nvblaslt.torch.linear × nn.Linear + activation (< 1 is faster)"]
        lines += [f"  {r['tokens']:4d} tokens {r['in']}->{r['out']:<6d} {r['activation']}: {r['ours_us']:7.2f} µs against "
                  f"{r['torch_us']:7.2f} µs, {r['ratio']:.3f}×  (max rel. diff {r['max_relative_error']:.1e})"
                  for r in results["graph"]["rows"]]
    if "breakdown" in results:
        section = results["breakdown"]
        torch_us = section["torch_us"]
        lines += ["", f"where matmul()'s time goes, {section['problem']} (host µs a call, or GPU time where longer; "
                      f"× torch's whole call)"]
        lines += [f"  {name:52s} {us:7.2f} µs {us / torch_us:6.3f}×" for name, us in section["us"].items()]
        lines.append(f"  {'launch + allocation + layout read + x.T':52s} {section['floor_us']:7.2f} µs "
                     f"{section['floor_us'] / torch_us:6.3f}×  (what no checking function form can skip)")
    if "seed" in results:
        section = results["seed"]
        plain = next((r["ms"] for r in section["rows"] if r["case"] == "plain matmul"), section["rows"][0]["ms"])
        m, k, n = section["shape"]
        lines += ["", f"seed shape fp16 ({m},{k}) @ ({k},{n}), ms (× plain matmul, heuristic #0)"]
        lines += [f"  {r['case']:44s} {r['ms']:8.3f} {r['ms'] / plain:7.3f}  {r['note']}" for r in section["rows"]]
    if "search" in results:
        section = results["search"]
        lines += ["", "search against autotune at the seed shape, re-timed in the same rounds (searched/autotuned ≤ 1 "
                      "is the target)",
                  "  (same*: the very same launch, algorithm bytes and workspace; 2nd proc: recalls the pick, no search)",
                  f"  {'epilog':14s} {'h0 ms':>8s} {'auto ms':>8s} {'srch ms':>8s} {'s/auto':>7s} {'95% bound':>15s} "
                  f"{'search':>7s}  {'kernel':8s} {'2nd proc':18s} decision"]
        nvmath_rows = [r for r in section["rows"] if "nvmath_autotuned_ms" in r]
        for r in section["rows"]:
            second = r["second_process"]
            other = (second["error"] or "")[:18] if second.get("error") else (
                f"{'same' if second['same_kernel'] else 'DIFFERENT'}, {'hit' if second['cache_hit'] else 'miss'} "
                f"{second['plan_ms'] or 0:.0f}ms")
            decision = "switched" if r["switched"] else "kept"
            if r["confidence"] is not None:
                decision += f" ({r['confidence']:.0%})"
            if r["form"]:
                decision += f"; {r['form'][0]} form"
            low, high = r.get("searched_over_autotuned_bounds") or (math.nan, math.nan)
            lines.append(f"  {r['epilog']:14s} {r['first_ms']:8.3f} {r['autotuned_ms']:8.3f} {r['searched_ms']:8.3f} "
                         f"{r['searched_over_autotuned']:7.3f} [{low:6.3f}, {high:6.3f}] {r['search_s']:6.1f}s  "
                         f"{('same*' if r.get('same_launch') else 'same') if r['same_kernel'] else 'other':8s} "
                         f"{other:18s} {decision}")
        if nvmath_rows:
            lines += ["  against nvmath-python's autotuned plan in the same rounds (paired ratio [95% bound]):",
                      f"  {'epilog':14s} {'nvm ms':>8s} {'autotuned/nvm':>24s} {'searched/nvm':>24s}"]
            for r in nvmath_rows:
                ratios = [f"{r[key]:7.3f} [{r[key + '_bounds'][0]:6.3f}, {r[key + '_bounds'][1]:6.3f}]"
                          for key in ("autotuned_over_nvmath", "searched_over_nvmath")]
                lines.append(f"  {r['epilog']:14s} {r['nvmath_autotuned_ms']:8.3f} {ratios[0]:>24s} {ratios[1]:>24s}")
    if "mlp" in results:
        mlp = results["mlp"]
        lines += ["", "mlp training step (nvblaslt.bench.mlp), ms and × eager PyTorch:"]
        lines += [f"  {line}" for line in mlp.get("summary_lines", [])] or [f"  {mlp.get('skipped') or 'see JSON'}"]
    if "import" in results:
        lines += ["", "cold start, fresh interpreters (median ms; a first result: imports, the first GEMM on CuPy "
                      "arrays, synchronize)"]
        lines += [f"  {name:34s} {row['seconds'] * 1000:8.0f} ms" for name, row in results["import"].items()
                  if isinstance(row, dict)]
        bytecode = results.get("import_bytecode", {})
        if bytecode:
            lines.append("  bytecode compiled first, as pip install does: " +
                         ", ".join(f"{name} {'yes' if done else 'no (source compiled in each process)'}"
                                   for name, done in bytecode.items()))
    for section, error in results.get("errors", {}).items():
        lines.append(f"!! section {section} failed: {error}")
    return lines


def chart(results: dict, path: Path) -> bool:
    """Ratios to each table's baseline, bars drawn from 1.0 so that 1-15 % differences show."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = []
    if "layer" in results:
        rows = [r for r in results["layer"]["rows"] if r["case"] != results["layer"]["baseline"]]
        panels.append(("layers: × torch _addmm_activation (bf16)", [
            (f"{r['tokens']}t {r['in']}->{r['out']} {r['epilog']} {r['case'].replace('nvblaslt ', '')}", r["ratio"])
            for r in rows], False))
    if "percall" in results:
        panels.append(("host time per call: × bare cublasLtMatmul (log)",
                       [(r["case"], r["ratio"]) for r in results["percall"]["rows"]], True))
    if "search" in results:
        panels.append(("search: × autotune() at the seed shape", [
            (f"{r['epilog']} {what}", r[key]) for r in results["search"]["rows"]
            for what, key in (("heuristic #0", "first_over_autotuned"), ("searched", "searched_over_autotuned"))],
            False))
        against_nvmath = [(f"{r['epilog']} {what}", r[key]) for r in results["search"]["rows"]
                          if "nvmath_autotuned_ms" in r
                          for what, key in (("autotuned", "autotuned_over_nvmath"), ("searched", "searched_over_nvmath"))]
        if against_nvmath:
            panels.append(("seed shape: × nvmath-python's autotuned plan, same rounds", against_nvmath, False))
    if "seed" in results:
        rows = results["seed"]["rows"]
        plain = next((r["ms"] for r in rows if r["case"] == "plain matmul"), rows[0]["ms"])
        panels.append(("seed shape: × plain matmul", [(r["case"], r["ms"] / plain) for r in rows], False))
    if not panels:
        return False
    heights = [max(2.0, 0.22 * len(bars) + 1.0) for _, bars, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights)), gridspec_kw={"height_ratios": heights},
                             squeeze=False)
    for ax, (title, bars, log) in zip(axes[:, 0], panels):
        labels, ratios = [b[0] for b in bars][::-1], [b[1] for b in bars][::-1]
        colors = ["tab:green" if r <= 1 else "tab:red" for r in ratios]
        ax.barh(labels, [r - 1 for r in ratios], left=1.0, color=colors)
        for y, ratio in enumerate(ratios):
            ax.text(ratio, y, f" {ratio:.3f} ", va="center", ha="left" if ratio >= 1 else "right", fontsize=6)
        ax.axvline(1.0, color="black", linewidth=0.8)
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(ratios) / 1.2, max(ratios) * 1.2)
        else:
            low, high = min(ratios + [1.0]), max(ratios + [1.0])
            pad = max(0.01, 0.08 * (high - low))
            ax.set_xlim(low - pad, high + pad)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="y", labelsize=6)
    info = results["machine"]
    fig.suptitle(f"nvblaslt on {info['gpu']}, cuBLASLt {info['cublaslt']}, {info['date']}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / sum(heights)))  # half an inch for the title
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write(results: dict, out: Path) -> None:
    """bench.json, bench.png (with matplotlib) and bench.txt under ``out``; then the tables, printed."""
    (out / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    drawn = chart(results, out / "bench.png")
    lines = summary_lines(results)
    (out / "bench.txt").write_text("\n".join(lines) + "\n")
    print(f"\nwrote {out / 'bench.json'}, {out / 'bench.txt'}"
          f"{', ' + str(out / 'bench.png') if drawn else ' (no chart: matplotlib not installed)'}"
          f"; {results['seconds']:.0f} s in all")
    print("\n".join(lines))
