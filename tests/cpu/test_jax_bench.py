"""``python -m nvblaslt.bench.jax`` on the CPU: its arguments, and a tiny run (XLA's rows timed, nvblaslt's
traced: the CPU has no cuBLASLt GEMM)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jax")

import nvblaslt  # noqa: E402

try:
    nvblaslt.library()
except nvblaslt.LibraryNotFoundError:
    pytest.skip("no libcublasLt: nvblaslt's rows are traced with the library's own rules", allow_module_level=True)

from nvblaslt.bench import jax as bench  # noqa: E402


def test_arguments():
    options = bench.parse(["--quick", "--widths", "64,128,64", "--activations", "gelu", "--tune", "search"])
    assert (options.rounds, options.steps, options.warmup) == (6, 3, 2)
    assert options.widths == [64, 128, 64] and options.activations == ["gelu"] and options.tune == "search"
    defaults = bench.parse([])
    assert defaults.widths == [4096, 16384, 4096, 16384, 4096] and defaults.tokens == 8192
    assert defaults.dtype == "bfloat16" and defaults.activations == ["relu", "gelu"] and defaults.ablation


@pytest.mark.parametrize("argv, message", [(["--widths", "64"], "--widths: expected two or more"),
                                           (["--activations", "tanh"], "--activations: expected some of"),
                                           (["--rounds", "0"], "--rounds: expected a positive int")])
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse(argv)
    assert message in capsys.readouterr().err


def test_a_tiny_run_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "jax.json"
    results = bench.main(["--device", "cpu", "--tokens", "32", "--widths", "16,32,16", "--rounds", "2", "--steps", "3",
                          "--json", str(out)])
    table = results["phases"]["heuristic plans"]
    assert set(table) == {"XLA: jnp.dot + bias + activation", "GEMM-only floor (jnp.dot, no bias/activation)"}
    assert table["GEMM-only floor (jnp.dot, no bias/activation)"]["relu"]["x_floor"] == 1.0
    assert json.loads(out.read_text())["phases"] == json.loads(json.dumps(results["phases"]))
    printed = capsys.readouterr().out
    assert "median of 2 interleaved rounds of 3 steps" in printed and "tanh-GELU" in printed


def test_the_entries_line_names_both_paths(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_graph_min_graph_size=1")
    line = bench.entries_line({"relu: nvblaslt.jax.dense": 10, "gelu: nvblaslt.jax.dense": 10,
                               f"relu: {bench.CAPTURED}": 0})
    assert line.startswith("Python entries per step: 10 op by op (one per cuBLASLt GEMM that runs")
    assert line.endswith("; 0 traced inside nvblaslt.jax.command_buffers() (command_buffer_compatible=True; "
                         "XLA_FLAGS: --xla_gpu_graph_min_graph_size=1)")
    monkeypatch.delenv("XLA_FLAGS")
    assert "XLA_FLAGS: XLA's defaults" in bench.entries_line({f"relu: {bench.CAPTURED}": 3})


def test_the_command_buffer_row_traces_its_gemms_capturable():
    import re

    import jax

    jnp = jax.numpy
    S = jax.ShapeDtypeStruct
    params = [(S((16, 32), jnp.bfloat16), S((32,), jnp.bfloat16)), (S((32, 16), jnp.bfloat16), S((16,), jnp.bfloat16))]
    rows = bench.steps(jax, "relu", 2, False, command_buffers=True)
    step = rows[bench.CAPTURED][0]
    traced = str(jax.make_jaxpr(step)(params, S((8, 16), jnp.bfloat16), S((8, 16), jnp.bfloat16)))
    assert set(re.findall(r"capturable=(\w+)", traced)) == {"True"}
    plain = str(jax.make_jaxpr(rows["nvblaslt.jax.dense"][0])(params, S((8, 16), jnp.bfloat16),
                                                              S((8, 16), jnp.bfloat16)))
    assert set(re.findall(r"capturable=(\w+)", plain)) == {"False"}
    assert bench.CAPTURED not in bench.steps(jax, "relu", 2, False)
