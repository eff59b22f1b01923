"""nvblaslt.jax.ragged_dot as far as JAX's CPU build can tell: the program it lowers to for CUDA (one XLA
call per grouped GEMM, no pass of XLA's over a result, marked for command buffers where traced inside
``command_buffers()``), the tail kernel compiled by NVRTC, and the callback's plan keys and capture
rules, driven with a stand-in grouped plan (no GPU runs here; tests/gpu/test_jax_gpu.py runs the rest).
The loaded cuBLASLt's version check is lifted for the tracing tests: they plan nothing.
"""

from __future__ import annotations

import re

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from nvblaslt import NvblasltValueError, _grouped_version, _jit  # noqa: E402

from tests import skips  # noqa: E402
from tests.fakes import StandInEntry  # noqa: E402

skips.without_library()

import nvblaslt.jax as nj  # noqa: E402
from nvblaslt.jax import _ragged, _ragged_launch, _tuning  # noqa: E402

S = jax.ShapeDtypeStruct
LHS, RHS, SIZES = S((96, 32), jnp.bfloat16), S((4, 32, 24), jnp.bfloat16), S((4,), jnp.int32)


@pytest.fixture
def traced_as_on_a_gpu(monkeypatch):
    monkeypatch.setattr(_grouped_version, "require_grouped", lambda lib, needed=0: None)
    monkeypatch.setattr(_ragged, "_on_gpu", lambda: True)


def _lowered(f, *args) -> str:
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _fwd_bwd(lhs, rhs, sizes):
    out, pullback = jax.vjp(lambda a, b: nj.ragged_dot(a, b, sizes), lhs, rhs)
    return out, pullback(jnp.ones_like(out))


def _ops(text: str) -> list:
    return re.findall(r"= (stablehlo\.\w+)", text)


def test_each_grouped_gemm_is_one_call_and_no_xla_pass_masks_a_result(traced_as_on_a_gpu):
    forward = _lowered(nj.ragged_dot, LHS, RHS, SIZES)
    assert re.findall(r"custom_call @(\w+)", forward) == ["xla_buffer_python_gpu_callback"]
    # the offsets' cumsum only: rows past the total are zeroed by the call, not by a select over the result
    assert "stablehlo.select" not in _ops(forward) and "stablehlo.compare" not in _ops(forward)
    both = _lowered(_fwd_bwd, LHS, RHS, SIZES)
    assert re.findall(r"custom_call @(\w+)", both) == ["xla_buffer_python_gpu_callback"] * 3
    assert "stablehlo.select" not in _ops(both)


def test_command_buffers_mark_the_grouped_calls_traced_inside(traced_as_on_a_gpu):
    with nj.command_buffers():  # a fresh function each time: jax.jit keeps a function's trace
        inside = _lowered(lambda *args: _fwd_bwd(*args), LHS, RHS, SIZES)
    outside = _lowered(lambda *args: _fwd_bwd(*args), LHS, RHS, SIZES)
    assert set(re.findall(r"custom_call @(\w+)", inside)) == {"xla_buffer_python_gpu_callback_cmd_buffer"}
    assert set(re.findall(r"custom_call @(\w+)", outside)) == {"xla_buffer_python_gpu_callback"}


def test_the_forms_are_fixed_at_trace_time(traced_as_on_a_gpu, monkeypatch):
    forms = []

    def recording(*fields):
        forms.append(_ragged_launch.Form(*fields))
        return forms[-1]
    monkeypatch.setattr(_ragged, "Form", recording)
    # shapes no other test traces: JAX keeps a custom VJP's traces by its static arguments and shapes
    jax.make_jaxpr(_fwd_bwd)(S((80, 32), jnp.bfloat16), RHS, SIZES)
    assert [(f.shapes, f.transposes, f.zero_tail) for f in forms] == [
        (((80, 32), (4, 32, 24), (4,), (80, 24)), (False, False), True),  # out: rows past the total zeroed
        (((80, 24), (4, 32, 24), (4,), (80, 32)), (False, True), True),  # dlhs = dout @ rhsᵀ
        (((80, 32), (80, 24), (4,), (4, 32, 24)), (True, False), False)]  # drhs: split along K, no row tail
    assert {(f.dtype, f.out_dtype) for f in forms} == {("bfloat16", "bfloat16")}


def test_off_gpu_it_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(_grouped_version, "require_grouped", lambda lib, needed=0: None)
    with pytest.raises(NvblasltValueError, match=r"^lhs, rhs: JAX's backend is cpu"):
        jax.make_jaxpr(lambda *args: nj.ragged_dot(*args))(LHS, RHS, SIZES)  # fresh: jit keeps traces


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_the_tail_kernel_compiles(arch):
    try:
        cubin = _jit.compile_cubin(_ragged_launch.TAIL_SOURCE, arch)
    except Exception as error:  # noqa: BLE001 - NVRTC missing: nothing here can compile
        pytest.skip(f"NVRTC: {error}")
    assert len(cubin) > 0 and _ragged_launch.TAIL_KERNEL.encode() in cubin


# ---- the callback's plans, with a stand-in entry ---------------------------------------------------
class _StandIn(StandInEntry):
    made: list = []

    def __init__(self, form, pointers, stream, device):
        tuning = _tuning.active()
        super().__init__(device, stream, tuning.generation if tuning is not None else 0)
        self.form = form

    def run(self, pointers, stream):
        self.runs.append(stream)


@pytest.fixture
def stand_in(monkeypatch):
    _StandIn.made = []
    monkeypatch.setattr(_ragged_launch, "_Entry", _StandIn)
    monkeypatch.setattr(_ragged_launch, "_plans", {})
    monkeypatch.setattr(_ragged_launch, "_latest", {})
    monkeypatch.setattr(_ragged_launch, "_captured", [])
    capturing: set = set()
    monkeypatch.setattr(_ragged_launch._cuda, "is_capturing", lambda stream: stream in capturing)
    return capturing


FORM = _ragged_launch.Form(((96, 32), (4, 32, 24), (4,), (96, 24)), "bfloat16", "bfloat16", (False, False), True)
POINTERS = (1 << 20, 2 << 20, 3 << 20, 4 << 20)


def test_a_plan_is_kept_per_form_gpu_stream_and_alignment(stand_in):
    _ragged_launch.run(FORM, 0, 100, POINTERS)
    _ragged_launch.run(FORM, 0, 100, tuple(p + 4096 for p in POINTERS))  # other buffers, alike aligned
    _ragged_launch.run(FORM, 1, 300, POINTERS)  # the other GPU
    _ragged_launch.run(FORM, 0, 100, (POINTERS[0] + 16, *POINTERS[1:]))  # lhs on 16 bytes: planned for it
    other = _ragged_launch.Form(FORM.shapes, "bfloat16", "float32", (False, False), True)
    _ragged_launch.run(other, 0, 100, POINTERS)
    _ragged_launch.run(FORM, 0, 200, POINTERS)  # another stream, uncaptured: a plan of its own
    assert [(e.form is FORM, e.device, e.runs) for e in _StandIn.made] == [
        (True, 0, [100, 100]), (True, 1, [300]), (True, 0, [100]), (False, 0, [100]), (True, 0, [200])]


def test_a_capture_replays_the_plan_its_first_run_made_and_keeps_it(stand_in):
    _ragged_launch.run(FORM, 0, 100, POINTERS)  # XLA's warm-up: uncaptured, on its stream
    stand_in.add(300)  # XLA records the command buffer on a stream of its own
    _ragged_launch.run(FORM, 0, 300, POINTERS)
    _ragged_launch.run(FORM, 0, 300, POINTERS)
    (entry,) = _StandIn.made
    assert entry.runs == [100, 300, 300] and entry.captured and _ragged_launch._captured == [entry]
    _ragged_launch.clear_plans()
    assert not entry.freed and list(_ragged_launch._latest.values()) == [entry]  # a replay still reads it


def test_a_capture_never_plans(stand_in):
    stand_in.add(300)
    with pytest.raises(NvblasltValueError, match=r"^stream: XLA is recording a command buffer with an nvblaslt "
                                                 r"ragged_dot that never ran outside one"):
        _ragged_launch.run(FORM, 0, 300, POINTERS)
    assert _StandIn.made == []


def test_clear_plans_frees_the_uncaptured_ones(stand_in):
    _ragged_launch.run(FORM, 0, 100, POINTERS)
    (entry,) = _StandIn.made
    nj.clear_plans()
    assert entry.freed and _ragged_launch._plans == {} and _ragged_launch._latest == {}
    _ragged_launch.run(FORM, 0, 100, POINTERS)
    assert len(_StandIn.made) == 2  # planned again


def test_an_autotune_context_makes_a_plan_again_but_not_under_capture(stand_in):
    _ragged_launch.run(FORM, 0, 100, POINTERS)
    with nj.autotune(search=False):
        stand_in.add(300)
        _ragged_launch.run(FORM, 0, 300, POINTERS)  # captured: the plan made before, as it is
        assert len(_StandIn.made) == 1
        _ragged_launch.run(FORM, 0, 100, POINTERS)
        generation = _tuning.active().generation
    first, second = _StandIn.made
    assert first.captured and not first.freed and second.runs == [100] and second is not first
    assert _ragged_launch._plans[(FORM, 0, 100, (256,) * 4)] is second and generation > 0
