"""The bench's options, its compact tables and its chart, from made-up figures (no GPU); a short
GPU run of its cheapest sections."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from nvblaslt.bench import cli, layer, mlp, report, search

ROOT = Path(__file__).resolve().parents[2]


def made_up_results() -> dict:
    layers = []
    for tokens in layer.LAYER_TOKENS:
        for d_in, d_out in layer.LAYER_WIDTHS:
            for epilog in layer.LAYER_EPILOGS:
                for case, ratio in (("torch _addmm_activation", 1.0), ("nvblaslt matmul()", 1.08),
                                    ("nvblaslt Matmul.execute()", 0.95)):
                    layers.append({"tokens": tokens, "in": d_in, "out": d_out, "epilog": epilog, "case": case,
                                  "us": 20.0 * ratio, "ratio": ratio})
    second = {"same_kernel": True, "cache_hit": True, "plan_ms": 3.0, "error": None}
    return {
        "machine": {"gpu": "NVIDIA H200", "driver_cuda": "13.0", "cublaslt": "13.1.0", "torch": "2.11",
                    "nvmath": None, "python": "3.12", "date": "2026-11-23 10:00"},
        "quick": True, "errors": {"mlp": "RuntimeError: example"},
        "percall": {"problem": "cupy fp32 W 100x784 @ x 784x256, RELU_BIAS", "bare_matches_matmul": 0.0,
                    "rows": [{"case": "bare ctypes cublasLtMatmul", "us_per_call": 9.0, "ratio": 1.0},
                             {"case": "matmul() (cached plan)", "us_per_call": 13.5, "ratio": 1.5}],
                    "profile": [{"function": "_function_form.py:58 matmul", "us": 3.2}]},
        "layer": {"rows": layers, "baseline": "torch _addmm_activation"},
        "seed": {"shape": [65536, 16384, 8192], "rows": [{"case": "plain matmul", "ms": 26.0, "note": ""},
                                                          {"case": "fused RELU_BIAS", "ms": 26.3, "note": "x"}]},
        "search": {"rows": [{"epilog": "RELU_BIAS", "first_ms": 26.4, "autotuned_ms": 26.2, "searched_ms": 26.2,
                             "searched_over_autotuned": 1.0, "first_over_autotuned": 1.008, "search_s": 8.5,
                             "same_kernel": True, "switched": False, "confidence": 0.4, "form": None,
                             "second_process": second},
                            {"epilog": "DRELU_BGRAD", "first_ms": 29.5, "autotuned_ms": 28.8, "searched_ms": 26.9,
                             "searched_over_autotuned": 0.934, "first_over_autotuned": 1.02, "search_s": 9.9,
                             "same_kernel": False, "switched": True, "confidence": 0.999,
                             "form": ["split", 26.9, 28.8], "second_process": second,
                             "nvmath_autotuned_ms": 28.9, "autotuned_over_nvmath": 0.996,
                             "autotuned_over_nvmath_bounds": [0.99, 1.002], "searched_over_nvmath": 0.931,
                             "searched_over_nvmath_bounds": [0.925, 0.937]}]},
        "breakdown": {"problem": "bf16 16 tokens 4096->4096 RELU_BIAS", "torch_us": 15.0, "floor_us": 14.0,
                      "us": {"torch _addmm_activation(b, x, w.t())": 15.0, "nvblaslt matmul(w, x.T, …)": 16.5,
                             "cublasLtMatmul alone (bare, the plan's arguments)": 10.0}},
        "mlp": {"summary_lines": ["step 1.00 ms"]},
        "import": {"import nvblaslt": {"seconds": 0.085, "runs": [0.085]},
                   "first result, cupy a @ b": {"seconds": 0.33, "runs": [0.33]}},
    }


def test_the_compact_tables_fit_the_last_hundred_lines():
    lines = report.summary_lines(made_up_results())
    text = "\n".join(lines)
    assert len(lines) < 100
    for expected in ("NVIDIA H200", "1.50×", "execute()", "DRELU_BGRAD", "split form", "same, hit",
                     "step 1.00 ms", "import nvblaslt                          85 ms",
                     "first result, cupy a @ b                330 ms", "section mlp failed", "1.100×", "0.933×",
                     "0.931 [ 0.925,  0.937]", "nvmath-python's autotuned"):
        assert expected in text, expected
    assert max(len(line) for line in lines) < 160


def test_the_chart_shows_ratios_from_one(tmp_path):
    pytest.importorskip("matplotlib")
    assert report.chart(made_up_results(), tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 10_000


def test_options_quick_sections_and_their_defaults():
    args = cli.arguments(["--quick", "--sections", "layer,search"])
    assert args.sections == ["layer", "search"] and args.repeats == 5 and args.calls == 500
    assert args.search_epilogs == search.QUICK_SEARCH_EPILOGS
    full = cli.arguments([])
    assert full.sections == list(cli.SECTIONS) and full.repeats == 16 and full.search_rounds == 24
    with pytest.raises(SystemExit):
        cli.arguments(["--sections", "layers"])


def test_the_mlp_section_passes_options_and_keeps_a_short_table(monkeypatch, tmp_path):
    given = []

    def main(argv):
        given.append(argv)
        return {"rows": {"PyTorch eager": {"relu": {"ms": 10.0, "x_eager": 1.0, "x_floor": 1.1}},
                         "FusedLinear eager": {"relu": {"ms": 9.0, "x_eager": 0.9, "x_floor": 0.99}}}}
    monkeypatch.setattr(mlp, "main", main)
    results: dict = {}
    mlp.section(cli.arguments(["--quick", "--out", str(tmp_path)]), None, results)
    assert "--quick" in given[0] and str(tmp_path / "mlp.json") in given[0]
    assert any("FusedLinear eager" in line and "0.900×" in line for line in results["mlp"]["summary_lines"])


def test_the_mlp_bench_times_through_the_shuffled_rounds(monkeypatch):
    """Every case once per round, each round in the order ``nvblaslt._timing`` draws (not rotated)."""
    from nvblaslt import _timing

    order: list[str] = []
    drawn = []

    def shuffler():
        generator = random.Random(3)
        drawn.append(generator)
        return generator
    monkeypatch.setattr(_timing, "new_shuffler", shuffler)
    cases = [(name, lambda name=name: order.append(name)) for name in "abcd"]
    medians, host = mlp._interleaved(None, cases, rounds=5, warmup=0, cuda=False)
    assert len(medians) == len(host) == 4 and len(drawn) == 1
    expected = random.Random(3)
    assert order == ["abcd"[i] for _ in range(5) for i in _timing.shuffled(expected, 4)]


def test_by_default_a_step_is_timed_to_a_synchronize_after_it():
    """A loop that logs loss.item() waits for every step, so the step's time is the wall clock to a
    synchronize after it: no spin kernel hides the host's time unless the spin timing is asked for."""
    import types
    import time as clock

    calls: list[str] = []
    cuda = types.SimpleNamespace(synchronize=lambda: calls.append("sync"),
                                 _sleep=lambda cycles: calls.append("spin"))
    torch = types.SimpleNamespace(cuda=cuda)
    cases = [("slow", lambda: (calls.append("step"), clock.sleep(0.004))), ("fast", lambda: calls.append("step"))]
    medians, host = mlp._interleaved(torch, cases, rounds=3, warmup=0, cuda=True)  # the default timing
    assert "spin" not in calls
    steps = [i for i, call in enumerate(calls) if call == "step"]
    assert len(steps) == 6 and all(calls[i - 1] == "sync" and calls[i + 1] == "sync" for i in steps)
    assert medians[0] >= 4.0 > medians[1] and host[0] >= 4.0


def test_the_mlp_bench_runs_as_a_smoke_test_on_cpu(capsys):
    pytest.importorskip("torch")
    results = mlp.main(["--device", "cpu", "--dtype", "float32", "--tokens", "16", "--widths", "8,16,8",
                        "--quick", "--no-compile", "--backward", "all"])
    assert set(results["rows"]) == {"nn.Linear + activation, eager", "GEMM-only floor (no bias, no activation)",
                                    "FusedLinear eager", "FusedLinear eager [unfused]", "FusedLinear eager [bgradb]",
                                    "FusedLinear eager [epilog]"}
    assert all(value < 1e-5 for value in results["checks"].values())
    assert results["legend"]["FusedLinear eager"] == {"backward": "auto", "plans": "heuristic plans",
                                                      "relu": "unfused", "gelu": "bgradb"}
    assert "FusedLinear eager: backward='auto', heuristic plans; ReLU: unfused (RELU_BIAS; " in capsys.readouterr().out


def test_the_mlp_bench_without_search_plans_from_an_empty_tuning_cache_of_its_own(monkeypatch, tmp_path):
    """"heuristic plans" must be the heuristics' own: the user's cache may hold an earlier search's picks,
    which plans recall (an H200 run after a --search run printed searched figures as heuristic ones)."""
    import os

    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    seen = []
    monkeypatch.setattr(mlp, "_measure", lambda options: seen.append((options.search,
                                                                      os.environ["NVBLASLT_CACHE_DIR"])) or {})
    mlp.main(["--device", "cpu"])
    mlp.main(["--device", "cpu", "--search"])
    (searched_first, scratch), searched = seen
    assert not searched_first and scratch != str(tmp_path) and not os.path.exists(scratch)  # removed after
    assert searched == (True, str(tmp_path))  # a search tunes into the user's cache, as --help says
    assert os.environ["NVBLASLT_CACHE_DIR"] == str(tmp_path)
    monkeypatch.delenv("NVBLASLT_CACHE_DIR")
    mlp.main(["--device", "cpu"])
    assert "NVBLASLT_CACHE_DIR" not in os.environ and seen[-1][1] not in (None, str(tmp_path))


def test_nothing_in_the_core_imports_the_bench():
    """The bench consumes the package; only the command line (``nvblaslt/__main__.py``) reaches it."""
    import ast

    package = ROOT / "nvblaslt"
    for path in package.rglob("*.py"):
        relative = path.relative_to(package)
        if relative.parts[0] in ("bench", "_generated") or relative.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [f"{'.' * node.level}{node.module or ''}"] + [alias.name for alias in node.names]
                     if isinstance(node, ast.ImportFrom) else [])
            assert not any(name.split(".")[-1] == "bench" or ".bench." in name or name.startswith("nvblaslt.bench")
                           for name in names), f"{path.relative_to(ROOT)}:{node.lineno} imports the bench"


def test_bench_without_a_gpu_says_so():
    done = subprocess.run([sys.executable, "-m", "nvblaslt", "bench", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "--sections" in done.stdout and "--quick" in done.stdout


def test_max_relative_keeps_nans_and_the_inputs_precision():
    torch = pytest.importorskip("torch")
    from nvblaslt.bench.common import max_relative

    assert math.isnan(max_relative(torch, torch.tensor([[1.0, float("nan")]]), torch.ones(1, 2)))
    exact = torch.randn(40, 3, dtype=torch.float64)
    # float64 inputs are compared in float64, slice by slice: a 1e-12 difference is seen, not rounded away
    assert 1e-13 < max_relative(torch, exact + 1e-12, exact, chunk_bytes=64) < 1e-11
    with pytest.raises(ValueError, match="shapes differ"):
        max_relative(torch, torch.ones(2, 3), torch.ones(3, 2))


def test_a_failing_nvblaslt_cold_start_row_raises_and_a_missing_peer_is_left_out():
    from nvblaslt.bench import import_time

    assert import_time._fresh("import somepeer", "import a_package_that_is_not_there") is None
    with pytest.raises(RuntimeError, match="fresh interpreter failed"):
        import_time._fresh("import nvblaslt", "raise SystemExit(3)")


def test_the_spin_timing_queues_each_step_behind_a_spin_and_times_gpu_events():
    import types

    calls: list[str] = []

    class Event:
        def __init__(self, enable_timing):
            self.at = None

        def record(self):
            calls.append("record")
            self.at = len(calls)

        def synchronize(self):
            calls.append("event sync")

        def elapsed_time(self, other):
            return float(other.at - self.at)
    cuda = types.SimpleNamespace(synchronize=lambda: calls.append("sync"), _sleep=lambda cycles: calls.append("spin"),
                                 Event=Event)
    torch = types.SimpleNamespace(cuda=cuda)
    medians, _ = mlp._interleaved(torch, [("a", lambda: calls.append("step"))], rounds=2, warmup=0, cuda=True,
                                  timing="spin")
    assert calls.count("spin") == 2 and "sync" not in calls[1:]
    assert all(calls[i - 2: i] == ["spin", "record"] for i, c in enumerate(calls) if c == "step")
    with pytest.raises(ValueError, match="timing"):
        mlp._interleaved(torch, [("a", lambda: None)], rounds=1, warmup=0, cuda=True, timing="events")


def test_both_timings_print_a_table_each_with_its_label(capsys):
    pytest.importorskip("torch")
    from nvblaslt.bench.timing import TIMINGS

    results = mlp.main(["--device", "cpu", "--dtype", "float32", "--tokens", "8", "--widths", "8,16,8",
                        "--quick", "--no-compile", "--timing", "both"])
    out = capsys.readouterr().out
    assert all(f"timed: {TIMINGS[mode]}" in out for mode in ("sync", "spin"))
    assert set(results["by_timing"]) == {"sync", "spin"} and results["rows"] == results["by_timing"]["sync"]


def test_wall_rounds_pays_each_calls_host_time_with_a_synchronize_after_it():
    import types

    from nvblaslt.bench.timing import wall_rounds

    calls: list[str] = []
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: calls.append("sync")))
    samples = wall_rounds(torch, [("a", lambda: calls.append("a")), ("b", lambda: calls.append("b"))], rounds=2,
                          calls=3)
    assert [len(s) for s in samples] == [2, 2]
    timed = calls[calls.index("sync") + 1:]  # after the warm-up's drain
    assert all(timed[i + 1] == "sync" for i, call in enumerate(timed) if call in "ab")
    assert timed.count("a") == timed.count("b") == 6
