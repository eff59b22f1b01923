"""autotune and the search on the GPU: never slower than autotune's pick beyond noise, within its
budget, remembered for a second process that plans without searching, and a tuning cache that
cannot break a plan (risky cases in their own process)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from nvblaslt import Matmul, _autotune, _tuning_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
M, K, N = 4096, 2048, 3072


def operands(seed: int = 0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=generator)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=generator)
    bias = torch.randn(M, device="cuda", dtype=torch.float16, generator=generator)
    return a, b, bias


def planned(a, b, bias, epilog="RELU_AUX_BIAS"):
    mm = Matmul(a, b)
    mm.plan(epilog=epilog, epilog_inputs={"bias": bias})
    return mm


def paired_ratio(first, second, rounds: int = 30) -> float:
    """Median over interleaved rounds of second's time over first's."""
    ratios = []
    for _ in range(rounds):
        times = []
        for mm in (first, second):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            mm.execute()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        ratios.append(times[1] / times[0])
    return sorted(ratios)[len(ratios) // 2]


def test_search_is_not_slower_than_autotune_and_keeps_its_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    a, b, bias = operands()
    autotuned, searched = planned(a, b, bias), planned(a, b, bias)
    autotuned.autotune(iterations=5)
    started = time.perf_counter()
    timings = _autotune.autotune(searched, iterations=5, search=True, remember=True, stream=None, budget_s=4.0)
    assert time.perf_counter() - started < 4.0 + 2.0
    report = searched.tuning_report
    assert report.searched and report.screened > 0 and timings[0][0] is searched.algorithm
    if report.switched:
        assert report.confidence >= 0.99 and report.interval[1] < 1.0
    assert paired_ratio(autotuned, searched) < 1.02  # the same kernel, or one measured faster
    d, aux = searched.execute()
    reference = torch.relu(a.float() @ b.float() + bias.float()[:, None])
    assert float((d.float() - reference).abs().max() / reference.abs().max()) < 5e-3


def test_a_second_process_recalls_the_pick_without_searching(tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    a, b, bias = operands()
    mm = planned(a, b, bias)
    mm.autotune(iterations=3, search=True)
    chosen = mm.algorithm.algorithm.config()
    code = textwrap.dedent(f"""
        import json, logging, torch
        from nvblaslt import Matmul, _autotune
        messages = []
        handler = logging.Handler(); handler.emit = lambda record: messages.append(record.getMessage())
        logging.getLogger("nvblaslt").addHandler(handler); logging.getLogger("nvblaslt").setLevel(logging.INFO)
        def no_search(*args, **kwargs):
            raise AssertionError("searched again")
        _autotune.autotune = no_search
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn({M}, {K}, device="cuda", dtype=torch.float16, generator=g)
        b = torch.randn({K}, {N}, device="cuda", dtype=torch.float16, generator=g)
        bias = torch.randn({M}, device="cuda", dtype=torch.float16, generator=g)
        mm = Matmul(a, b)
        mm.plan(epilog="RELU_AUX_BIAS", epilog_inputs={{"bias": bias}})
        mm.execute()
        print(json.dumps({{"config": mm.algorithm.algorithm.config(),
                          "hit": any("tuning cache hit" in m for m in messages)}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    second = json.loads(done.stdout.strip().splitlines()[-1])
    assert second["hit"] and second["config"] == chosen


def test_split_or_fused_bias_gradient_is_remembered_and_right(tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    a, b, bias = operands()
    _, aux = planned(a, b, bias).execute()
    mm = Matmul(a, b)
    mm.plan(epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})
    _autotune.autotune(mm, iterations=3, search=True, remember=True, stream=None, budget_s=4.0)
    form = mm.bias_gradient_form
    assert form[0] in ("fused", "split") and form[1] > 0 and form[2] > 0
    d, outputs = mm.execute()
    expected = d.float().sum(dim=1)
    got = outputs["drelu_bgrad"].float().reshape(-1)  # (M, 1), as nvmath-python shapes it
    assert float((got - expected).abs().max() / expected.abs().max()) < 2e-2
    entries = _tuning_cache.cache_at(_tuning_cache.cache_path()).entries()
    assert any(e.get("bias_gradient_form") == form[0] for e in entries.values())


RISKY_CACHE = {
    "garbage algorithm bytes": "entries[key] = {'algo': 'ff' * 64, 'ms': 1.0}",
    "zero algorithm bytes": "entries[key] = {'algo': '00' * 64, 'ms': 1.0}",
    "a list": "document = [1, 2]",
    "an entry that is a string": "entries[key] = 'x'",
}


@pytest.mark.parametrize("case", RISKY_CACHE)
def test_a_broken_cache_never_breaks_a_plan(tmp_path, case):
    """Each in its own process: a crash inside cuBLASLt on bad bytes is a failure, not the end of the run."""
    code = textwrap.dedent(f"""
        import json, warnings, torch
        from pathlib import Path
        from nvblaslt import Matmul, _tuning_cache
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(256, 128, device="cuda", dtype=torch.float16, generator=g)
        b = torch.randn(128, 192, device="cuda", dtype=torch.float16, generator=g)
        mm = Matmul(a, b)
        mm.plan()
        key = _tuning_cache.problem_key(_tuning_cache.problem_description(mm._launch))
        entries = {{}}
        document = None
        {RISKY_CACHE[case]}
        if document is None:
            document = {{"format": _tuning_cache.FORMAT, "version": _tuning_cache.VERSION, "entries": entries}}
        Path({str(tmp_path)!r}, "tuning.json").write_text(json.dumps(document))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            again = Matmul(a, b)
            again.plan()
            d = again.execute()
        assert float((d.float() - a.float() @ b.float()).abs().max()) < 0.5
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "NVBLASLT_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_an_unwritable_cache_does_not_fail_the_search(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(blocker / "cache"))
    a, b, bias = operands()
    mm = planned(a, b, bias, "RELU_BIAS")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _autotune.autotune(mm, iterations=2, search=True, remember=True, stream=None, budget_s=2.0)
    assert any(issubclass(w.category, _tuning_cache.TuningCacheWarning) for w in record)
    again = planned(a, b, bias, "RELU_BIAS")  # the choice is still in this process's memory
    assert again.algorithm.algorithm.config() == mm.algorithm.algorithm.config()


@pytest.mark.parametrize("m, k, n, epilog", [(64, 4096, 1024, "RELU_BIAS"), (256, 2048, 512, "GELU_AUX_BIAS"),
                                             (8, 8192, 1024, "BIAS")])
def test_every_algorithm_the_search_offers_gives_the_right_result(m, k, n, epilog):
    """The search's pool (other custom options and split-K counts included) on fresh random operands: each
    candidate, planned alone, gives D (and the GELU aux) of the float64 reference, every element written."""
    from nvblaslt import _search

    generator = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=generator)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=generator) / k ** 0.5
    bias = torch.randn(m, device="cuda", dtype=torch.bfloat16, generator=generator)
    z = a.double() @ b.double() + bias.double()[:, None]
    if epilog == "RELU_BIAS":
        expected = torch.relu(z)
    elif epilog == "GELU_AUX_BIAS":
        expected = 0.5 * z * (1 + torch.tanh(0.7978845608028654 * (z + 0.044715 * z ** 3)))
    else:
        expected = z
    mm = planned(a, b, bias, epilog)
    launch = mm._launch
    pool = list(itertools.islice(_search.candidates(launch, workspace_limit=launch.workspace_limit,
                                                    incumbent=mm.algorithm), 400))
    assert pool, "the search offered nothing"
    splits = 0
    allowed = int(launch.preference.get("REDUCTION_SCHEME_MASK"))
    for candidate in pool:
        splits += candidate.algorithm.get("SPLITK_NUM") > 1
        # a split-K reduction the plan excludes (OUTPUT_TYPE into a 16-bit D) is within the tolerance below
        assert _tuning_cache.reduces_as_allowed(candidate, allowed), _tuning_cache.describe_algorithm(candidate)
        with Matmul(a, b) as one:
            one.plan(epilog=epilog, epilog_inputs={"bias": bias}, algorithms=[candidate.as_bytes()])
            out = one.execute()
            d, aux = out if isinstance(out, tuple) else (out, {})
            torch.cuda.synchronize()
            name = _tuning_cache.describe_algorithm(candidate)
            assert torch.isfinite(d).all(), name
            error = float((d.double() - expected).abs().max() / expected.abs().max())
            assert error < 2e-2, f"{name}: relative error {error:.3g}"
            if epilog == "GELU_AUX_BIAS":
                pre = aux["gelu_aux"][..., :m, :].double()  # rows past M are padding
                assert float((pre - z).abs().max() / z.abs().max()) < 2e-2, f"{name}: the GELU aux"
    print(f"{len(pool)} candidates, {splits} with split-K, all right")


def test_the_screening_times_a_decode_gemm_without_the_hosts_time_to_issue_it():
    """A 1-token GEMM (bf16, 4096 → 6144: about 22 µs on an H200). Before the Timer checked that the host had
    queued each call before the GPU reached it, the screening read the incumbent at 46–66 µs and its own
    kernel's other options at 24 µs or 60 µs, and ranked candidates by that. The incumbent's runs in the
    screening must read what it reads timed on its own, within noise."""
    from nvblaslt import _search, _timing

    a = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16).T
    with Matmul(a, b) as mm:
        mm.plan()
        stream = torch.cuda.current_stream().cuda_stream
        launch = mm._launch
        incumbent = _autotune._algorithm(mm, launch.algorithm, stream)
        references: list[float] = []

        class Recording(_timing.Timer):
            def __call__(self, run, prepare=None):
                ms = super().__call__(run, prepare)
                if run is incumbent.run:
                    references.append(ms)
                return ms
        with Recording(mm.device, stream) as timer:
            clean = sorted(timer(incumbent.run, incumbent.prepare) for _ in range(21))[10]
            references.clear()
            pool = _search.candidates(launch, workspace_limit=launch.workspace_limit, incumbent=launch.algorithm)
            screened, _, _ = _autotune._screen(mm, timer, incumbent, itertools.islice(pool, 48), stream,
                                               deadline=time.perf_counter() + 10)
        assert screened
        # each group of 8 candidates is timed after one run of the incumbent
        assert len(references) >= 5 and max(references) < 1.5 * clean, (clean, references)


def test_a_timers_sample_costs_its_cover_and_the_call_in_wall_time():
    """The duels' time estimates read ``Timer.sample_s``: for a decode GEMM (about 22 µs on an H200) the L2
    flushes queued ahead of each sample take about ten times the call, and the estimates must see that."""
    from nvblaslt import _timing

    a = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16).T
    with Matmul(a, b) as mm:
        mm.plan()
        stream = torch.cuda.current_stream().cuda_stream
        run = _autotune._algorithm(mm, mm._launch.algorithm, stream)
        with _timing.Timer(mm.device, stream) as timer:
            assert timer.sample_s == 0.0
            call_ms = sorted(timer(run.run, run.prepare) for _ in range(21))[10]
            assert 3 * call_ms / 1000 < timer.sample_s < 0.05, (call_ms, timer.sample_s, timer.cover)
