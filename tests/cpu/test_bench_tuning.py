"""``python -m nvblaslt.bench.tuning`` without a GPU: its arguments, its problems (well-formed, what the
issue asks of the subset, readable by ``nvblaslt tune --problems``), and the pure parts of its figures."""

from __future__ import annotations

import json
import math

import pytest

from nvblaslt import _tune_suite
from nvblaslt._tuning_record import read_problems
from nvblaslt.bench import invariance, tuning, tuning_recall
from nvblaslt.bench.tuning_problems import (QUICK_SUITE, QUICK_VARIANTS, problems, signature, suite_pairs,
                                            torch_baseline, torch_layer_route)


# ---- arguments ------------------------------------------------------------------------------------------------
def test_quick_defaults_fit_the_time_share():
    args = tuning.arguments(["--quick"])
    assert (args.seconds, args.tune_budget, args.rounds, args.invariance_rounds) == (300.0, 75.0, 11, 7)
    assert args.parts == list(tuning.PARTS) and args.json is None
    # both tunes, the tune children's grace and the later parts' reserve stay inside the share's order
    assert 2 * args.tune_budget + sum(tuning.RESERVE_S.values()) < args.seconds


def test_seconds_sets_the_tune_budget_unless_it_is_given():
    assert tuning.arguments(["--seconds", "1000"]).tune_budget == 250.0
    args = tuning.arguments(["--seconds", "1000", "--tune-budget", "40", "--rounds", "5", "--json", "x.json"])
    assert (args.tune_budget, args.rounds, str(args.json)) == (40.0, 5, "x.json")
    assert tuning.arguments([]).seconds == 2400.0


@pytest.mark.parametrize("argv, message", [
    (["--parts", "tunes,speed"], "unknown ['speed']"),
    (["--parts", "duels"], "add tunes"),
    (["--seconds", "0"], "--seconds: expected a positive number"),
    (["--rounds", "-1"], "--rounds: expected a positive number"),
])
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        tuning.arguments(argv)
    assert message in capsys.readouterr().err


def test_parts_without_tunes_are_allowed_where_they_need_no_database():
    assert tuning.arguments(["--parts", "invariance"]).parts == ["invariance"]


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert tuning.main(["--quick", "--json", str(tmp_path / "out.json"), "--out", str(tmp_path)]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


# ---- the problems ----------------------------------------------------------------------------------------------
def test_the_quick_subset_is_representative_and_has_no_duplicate():
    specs = problems(quick=True)
    assert len(specs) == len(QUICK_SUITE) + len(QUICK_VARIANTS)
    assert len({signature(s) for s in specs}) == len(specs) and len({s["name"] for s in specs}) == len(specs)
    names = " ".join(s["name"] for s in specs)
    assert {m for m in _tune_suite.MODELS if m + "." in names} >= {"llama3-8b", "llama3-70b", "qwen3-8b",
                                                                   "qwen3-30b-a3b"}
    assert {int(s["name"].rsplit("T=", 1)[1]) for s in specs} == set(_tune_suite.TOKENS)
    assert {s["epilog"] for s in specs} == {"DEFAULT", "BIAS", "RELU_BIAS", "GELU_BIAS", "GELU_AUX_BIAS", "DGELU",
                                            "BGRADB"}
    assert {s["a"]["dtype"] for s in specs} == {"bfloat16", "float8_e4m3fn"}
    assert all(s["kind"] == "matmul" for s in specs)  # grouped GEMM is left out, and said so


def test_every_quick_problem_is_the_suites_or_its_up_projection_with_a_bias_epilog():
    suite = {s["name"]: s for s in _tune_suite.llm_suite()}
    for spec in problems(quick=True):
        if spec["name"] in suite:
            assert spec == suite[spec["name"]]
            continue
        base = suite[spec["name"].replace(spec["epilog"], "GELU_AUX_BIAS")]
        assert spec["epilog"] in ("BIAS", "RELU_BIAS", "GELU_BIAS")
        assert {k: v for k, v in spec.items() if k not in ("name", "epilog")} == \
            {k: v for k, v in base.items() if k not in ("name", "epilog")}


def test_the_whole_set_is_every_distinct_dense_suite_problem_with_the_bias_forms():
    specs = problems(quick=False)
    dense = {signature(s) for s in _tune_suite.llm_suite() if s["kind"] == "matmul"}
    ups = [s for s in specs if s["epilog"] == "GELU_AUX_BIAS"]
    assert len({signature(s) for s in specs}) == len(specs) == len(dense) + 3 * len(ups)
    assert dense <= {signature(s) for s in specs}


def test_the_problems_file_reads_back_as_nvblaslt_tune_reads_it(tmp_path):
    specs = problems(quick=True)
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(s, sort_keys=True) + "\n" for s in specs))
    assert read_problems(path) == specs


def test_the_suites_pairs_are_out_by_in_features_of_every_dense_layer():
    pairs = suite_pairs()
    assert len(pairs) == len(set(pairs)) == 15
    assert {(6144, 4096), (4096, 14336), (14336, 4096), (57344, 8192), (5120, 2048), (2048, 4096)} <= set(pairs)


def test_every_problem_names_torch_s_call_and_the_torch_layer_maps_bf16_ones():
    for spec in problems(quick=False):
        assert torch_baseline(spec).startswith("torch.")
        route = torch_layer_route(spec)
        if spec["a"]["dtype"] != "bfloat16" or spec["epilog"] == "DGELU":
            assert route is None
        else:
            assert route is not None and route.startswith("linear(")


# ---- the figures' arithmetic -----------------------------------------------------------------------------------
def row(name, first_over_db, torch_over_db, db1_over_db2=None, same=False, torch_bounds=None, torch_kernels=False):
    bounds = torch_bounds or (torch_over_db - 0.01, torch_over_db + 0.01)
    found = {"name": name, "first_over_db1": {"ratio": first_over_db},
             "torch_over_db1": {"ratio": torch_over_db, "bounds": list(bounds)}, "same_kernels_as_torch": torch_kernels}
    if db1_over_db2 is not None:
        found.update(same_pick=same, db1_over_db2={"ratio": db1_over_db2})
    return found


def test_duel_summary_geomean_worst_and_slower_than_torch():
    rows = [row("a", 1.10, 1.2), row("b", 1.0, 0.98), row("c", 0.95, 1.0), {"name": "no entry"},
            row("noise", 1.0, 0.998, torch_bounds=(0.99, 1.004), torch_kernels=True)]
    summary = tuning.summarize_duels(rows)
    assert summary["geomean"] == pytest.approx(math.exp((math.log(1.1) + math.log(0.95)) / 4))
    assert (summary["worst"], summary["worst_problem"]) == (0.95, "c")
    assert summary["with_entry"] == 4 and summary["problems"] == 5
    # the verdict counts a problem torch's call beats beyond the duel's bounds; one slower by the median alone,
    # running torch's very kernels, is listed as such
    assert summary["slower_than_torch"] == ["b"] and summary["slower_than_torch_by_median"] == ["b", "noise"]
    assert summary["slower_by_median_same_kernels"] == ["noise"] and summary["same_kernels_as_torch"] == 1


def test_agreement_counts_the_same_kernel_and_kernels_within_one_percent():
    rows = [row("same", 1, 1, 1.0, same=True), row("close", 1, 1, 1.009), row("far", 1, 1, 0.97), row("one only", 1, 1)]
    agreed = tuning.agreement(rows)
    assert (agreed["both"], agreed["same"], agreed["agree"]) == (3, 1, 2)
    assert agreed["fraction"] == pytest.approx(2 / 3) and [d["name"] for d in agreed["disagree"]] == ["far"]
    assert tuning.verdict(agreed["fraction"], tuning.TARGETS["agreement"]) == "MISSED"
    assert tuning.agreement([])["fraction"] is None


def test_a_disagreement_is_far_apart_only_beyond_the_duels_bounds(capsys):
    far, noisy = row("far", 1, 1, 0.97), row("noisy", 1, 1, 1.02)
    far["db1_over_db2"]["bounds"], noisy["db1_over_db2"]["bounds"] = [0.96, 0.985], [1.005, 1.03]
    agreed = tuning.agreement([far, noisy, row("same", 1, 1, 1.0, same=True)])
    assert agreed["agree"] == 1 and [(d["name"], d["beyond_bounds"]) for d in agreed["disagree"]] == \
        [("far", True), ("noisy", False)]
    tuning.report_duels([], {"slower_than_torch": [], "slower_than_torch_by_median": [], "with_entry": 0,
                             "slower_by_median_same_kernels": [], "same_kernels_as_torch": 0}, agreed)
    shown = capsys.readouterr().out
    assert "of the 2 that differ, 1 more than 1% apart beyond the duel's 95 % bounds" in shown
    assert "differ: noisy: database 1's pick at 1.020× database 2's (bounds 1.005–1.030)" in shown
    noisy["said"] = ["default, its best challenger 0.986×", "tuned at 0.982×"]
    tuning.report_duels([], {"slower_than_torch": [], "slower_than_torch_by_median": [], "with_entry": 0,
                             "slower_by_median_same_kernels": [], "same_kernels_as_torch": 0},
                        tuning.agreement([noisy]))
    assert ("differ: noisy: database 1's pick at 1.020× database 2's (bounds 1.005–1.030) (tune 1: default, its "
            "best challenger 0.986×; tune 2: tuned at 0.982×)") in capsys.readouterr().out


def test_an_entry_runs_its_algorithm_or_the_first_pick():
    first = bytes(64)
    assert tuning.pick_of({"kind": "tuned", "algo": "ab" * 64}, first) == (bytes.fromhex("ab" * 64), "fused")
    assert tuning.pick_of({"kind": "default"}, first) == (first, "fused")
    assert tuning.pick_of({"kind": "default", "bias_gradient_form": "split"}, first) == (first, "split")
    assert tuning.pick_of(None, first) is None


def test_recall_status_reads_the_tuning_database_s_log_lines():
    summary = "BIAS D 4096x16 A/B/C/D CUDA_R_16BF/... on NVIDIA H200"
    assert tuning_recall.recall_status([f"tuning database hit: id 1 for {summary} (0.1 ms when searched)"],
                                       summary) == "hit"
    assert tuning_recall.recall_status([f"tuning database: the heuristics' first pick stays for {summary}"],
                                       summary) == "default"
    assert tuning_recall.recall_status([f"tuning cache hit: id 1 for {summary} (…)"], summary) == "none"
    assert tuning_recall.recall_status(["tuning database hit: id 1 for another problem (…)"], summary) == "none"
    # the messages _tuning_cache.recall writes for an entry in the two-call bias-gradient form
    assert tuning_recall.recall_status([f"tuning database hit: id 1 for {summary} (0.1 ms when searched, split "
                                        f"bias-gradient form); no search"], summary) == "hit+split"
    assert tuning_recall.recall_status([f"tuning database: the heuristics' first pick stays, in the split "
                                        f"bias-gradient form for {summary}"], summary) == "default+split"


def test_recall_of_a_split_form_entry_is_exact_only_where_the_plan_ran_the_split_form():
    entries = {"k1": {"kind": "default", "bias_gradient_form": "split"}}
    found = {"split": {"key": "k1", "algo": "aa", "Matmul": "default+split", "matmul()": "default",
                       "first_pick": "aa"}}
    result = tuning_recall.evaluate(found, entries)
    assert result["paths"]["Matmul"] == {"exact": 1, "plans": 1}
    assert result["paths"]["matmul()"] == {"exact": 0, "plans": 1} and len(result["misses"]) == 1


def test_recall_is_exact_only_where_every_path_ran_the_database_s_choice():
    entries = {"k1": {"kind": "tuned", "algo": "aa"}, "k2": {"kind": "default"}}
    found = {"tuned": {"key": "k1", "algo": "aa", "Matmul": "hit", "matmul()": "hit", "nvblaslt.torch": "hit",
                       "first_pick": "bb"},
             "kept": {"key": "k2", "algo": "cc", "Matmul": "default", "matmul()": "none", "first_pick": "cc"},
             "absent": {"key": "k3", "algo": "dd", "Matmul": "none", "matmul()": "none", "first_pick": "dd"}}
    result = tuning_recall.evaluate(found, entries)
    assert result["paths"] == {"Matmul": {"exact": 2, "plans": 2}, "matmul()": {"exact": 1, "plans": 2},
                               "nvblaslt.torch": {"exact": 1, "plans": 1}}
    assert result["not_in_database"] == ["absent"] and len(result["misses"]) == 1


def test_invariance_summary_checks_each_m_against_its_target():
    speed = {m: {"ratio": 1.0} for m in invariance.SPEED_M}
    speed[16] = {"ratio": 0.9}
    speed[8192] = {"ratio": 0.86}
    part = {"rows": [{"n": 4096, "k": 4096, "epilog": "BIAS", "speed": speed, "bitwise_differs": []},
                     {"n": 1024, "k": 8192, "epilog": "GELU_BIAS", "error": "NvblasltUnsupportedError: no pin"}],
            "pairs_left_out": [], "rounds": 3}
    summary = invariance.summarize(part)
    assert (summary["lowest_small"], summary["lowest_large"]) == (0.9, 0.86)
    assert summary["misses"] == ["N=4096 K=4096 BIAS M=16: 0.900× (target ≥ 0.95)"]
    assert len(summary["errors"]) == 1 and summary["bitwise_differs"] == []


def test_the_closing_lines_say_met_missed_or_no_figure_for_every_target():
    assert all(line.endswith("no figure") for line in tuning.targets_lines({}))
    results = {"duels": {"summary": {"geomean": 1.06, "worst": 0.97, "with_entry": 2, "slower_than_torch": []}},
               "agreement": {"fraction": 1.0}, "recall": {"paths": {"Matmul": {"exact": 1, "plans": 2}}},
               "invariance": {"summary": {"lowest_small": 0.96, "lowest_large": 0.8, "bitwise_differs": ["x"]}}}
    lines = tuning.targets_lines(results)
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["met", "MISSED", "met", "met", "MISSED", "met", "MISSED",
                                                           "MISSED"]


def test_invariance_report_judges_the_two_ends_and_shows_the_m_between(capsys):
    speed = {m: {"ratio": 1.0, "kernel": f"id 1 tile {2 if m > 64 else 1} split 1"} for m in invariance.SPEED_M}
    speed[128] = {"ratio": 0.5, "kernel": "id 1 tile 2 split 1"}  # between the two ends: reported, not judged
    speed[1536] = {"ratio": 1.0, "kernel": "id 1 tile 7 split 1", "served": "member", "default_splits_k": False}
    speed[12] = {"ratio": 1.0, "kernel": "id 1 tile 1 split 1", "served": "rung", "default_splits_k": True}
    part = {"rows": [{"n": 4096, "k": 4096, "epilog": "BIAS", "speed": speed, "bitwise_differs": [300, 4096]}],
            "pairs_left_out": [], "rounds": 3, "database": "pins.jsonl"}
    summary = invariance.summarize(part)
    assert summary["misses"] == [] and summary["bitwise_differs"] == ["N=4096 K=4096 BIAS: M=300",
                                                                      "N=4096 K=4096 BIAS: M=4096"]
    invariance.report(part, summary)
    shown = capsys.readouterr().out
    assert "  0.500 " in shown and "DIFFERS at 2 M" in shown and "M=128: id 1 tile 2 split 1;" in shown
    # which M ran a verified member and which a rung, and where the default split K
    assert "M=1536: id 1 tile 7 split 1 (member);" in shown and "M=12: id 1 tile 1 split 1 (rung), default splits K;" \
        in shown and f"BIAS (a member at 1 of {len(invariance.SPEED_M)} M): " in shown
    assert {1, 300, 511, 512, 513, 8191} <= set(invariance.BITWISE_M) and 301 not in invariance.BITWISE_M


def test_each_tune_writes_its_search_log_into_out(tmp_path, monkeypatch):
    """Two tunes that chose differently are read side by side from their logs: the bench asks each for one."""
    commands = []

    class Child:
        def __init__(self, command, **kwargs):
            commands.append(command)
            self.stdout = iter(["[1/1] a problem: default (0.5 s, 1 s left)\n"])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def wait(self):
            return 0

        def kill(self):
            pass
    monkeypatch.setattr(tuning.subprocess, "Popen", Child)
    found = tuning.run_tune(2, tmp_path / "problems.jsonl", tmp_path / "tuning-2.jsonl", 10.0, tmp_path)
    assert found["returncode"] == 0 and found["lines"] == ["[1/1] a problem: default (0.5 s, 1 s left)"]
    command = commands[0]
    assert command[command.index("--log") + 1] == str(tmp_path / "tune-2.log")
    assert command[command.index("-o") + 1] == str(tmp_path / "tuning-2.jsonl")
