"""nvblaslt.jax under ``shard_map`` and command buffers, as far as JAX's CPU build can tell: types and
per-shard shapes at trace time, the lowering for CUDA, and the bridge's per-GPU plan keys (driven
with a stand-in plan: no GPU runs here). tests/gpu/test_jax_shard_gpu.py runs the same on two GPUs.
"""

from __future__ import annotations

import re

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from nvblaslt import NvblasltTypeError, NvblasltValueError  # noqa: E402

from tests import skips  # noqa: E402
from tests.fakes import StandInEntry  # noqa: E402

skips.without_library()

from jax.sharding import AbstractMesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import nvblaslt.jax as nj  # noqa: E402
from nvblaslt.jax import _bridge, _tuning  # noqa: E402

S = jax.ShapeDtypeStruct
MESH = AbstractMesh((2,), ("x",))  # two shards, no devices needed to trace


def _loss(x, w1, b1, w2):
    y = nj.dense(x, [(w1, b1), (w2, None)], "relu")
    return jax.lax.psum((y.astype(jnp.float32) ** 2).sum(), "x")


SHARDED_GRAD = jax.shard_map(jax.grad(_loss, argnums=(0, 1, 2, 3)), mesh=MESH, in_specs=(P("x"), P(), P(), P()),
                             out_specs=(P("x"), P(), P(), P()))
ARGS = (S((64, 32), jnp.float32), S((32, 16), jnp.float32), S((16,), jnp.float32), S((16, 8), jnp.float32))


def test_each_shard_plans_its_own_rows():
    jaxpr = str(jax.make_jaxpr(SHARDED_GRAD)(*ARGS))
    # the forward GEMM of the first layer reads x's 32 rows of each shard, not the 64 of the whole
    assert re.search(r"b=Layout\(shape=\(32, 32\), dtype='float32', transposed=True\)", jaxpr)
    assert "shape=(64, 32)" not in jaxpr.split("shard_map")[1]


def test_sharded_gradients_have_their_inputs_types():
    """Each GEMM's results vary over the mesh axis as its operands do: the weights' gradients are summed
    over the shards (as jnp.dot's are), the input gradient is each shard's own."""
    got = jax.eval_shape(SHARDED_GRAD, *ARGS)
    assert [(g.shape, g.dtype.name) for g in got] == [((64, 32), "float32"), ((32, 16), "float32"),
                                                      ((16,), "float32"), ((16, 8), "float32")]
    jaxpr = jax.make_jaxpr(SHARDED_GRAD)(*ARGS)
    body = jaxpr.jaxpr.eqns[0].params["jaxpr"]
    summed = [e for e in body.eqns if e.primitive.name.startswith("psum")]
    shapes = sorted(tuple(e.outvars[0].aval.shape) for e in summed)
    assert shapes == [(), (16,), (16, 8), (32, 16)]  # the loss, and the three parameters; never x's gradient
    gemms = [e for e in jax.make_jaxpr(SHARDED_GRAD)(*ARGS).eqns[0].params["jaxpr"].eqns
             if e.primitive.name == "nvblaslt_gemm"]
    for eqn in gemms:
        for out in eqn.outvars:
            assert "{V:x}" in str(out.aval) or "vma=frozenset({'x'})" in repr(out.aval), out.aval


def test_matmul_gradients_under_shard_map():
    def loss(a, b, bias):
        y = nj.matmul(a, b, epilog="GELU_BIAS", epilog_inputs={"bias": bias})
        return jax.lax.psum((y * y).sum(), "x")

    grad = jax.shard_map(jax.grad(loss, argnums=(0, 1, 2)), mesh=MESH, in_specs=(P(), P(None, "x"), P()),
                         out_specs=(P(), P(None, "x"), P()))
    got = jax.eval_shape(grad, S((64, 32), jnp.float32), S((32, 16), jnp.float32), S((64,), jnp.float32))
    assert [g.shape for g in got] == [(64, 32), (32, 16), (64,)]


def test_a_sharded_program_lowers_for_cuda_with_per_shard_buffers():
    f = jax.shard_map(lambda x, w: nj.matmul(x, w), mesh=MESH, in_specs=(P("x"), P()), out_specs=P("x"))
    text = jax.jit(f).trace(S((64, 32), jnp.float32), S((32, 16), jnp.float32)).lower(
        lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call @xla_buffer_python_gpu_callback" in line]
    assert len(calls) == 1 and "-> tensor<32x16xf32>" in calls[0], calls


def _lowered_targets(f, *args) -> set:
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return set(re.findall(r"stablehlo\.custom_call @(\w+)", text))


def test_command_buffers_mark_the_calls_traced_inside():
    args = (S((64, 32), jnp.float32), S((32, 16), jnp.float32))
    assert _lowered_targets(lambda a, b: nj.matmul(a, b), *args) == {"xla_buffer_python_gpu_callback"}
    assert not _tuning.capturable()
    with nj.command_buffers():
        assert _tuning.capturable()
        with nj.command_buffers():  # contexts nest
            pass
        assert _tuning.capturable()
        inside = _lowered_targets(lambda a, b: nj.matmul(a, b, epilog="RELU"), *args)
        grads = jax.make_jaxpr(jax.grad(lambda a, b: nj.matmul(a, b, epilog="GELU").sum()))(*args)
    assert not _tuning.capturable()
    assert inside == {"xla_buffer_python_gpu_callback_cmd_buffer"}
    assert set(re.findall(r"capturable=(\w+)", str(grads))) == {"True"}  # the backward's GEMMs too
    vmapped = jax.make_jaxpr(jax.vmap(lambda a: nj.matmul(a, jnp.ones((32, 16)))))(S((3, 64, 32), jnp.float32))
    assert set(re.findall(r"capturable=(\w+)", str(vmapped))) == {"False"}  # traced outside: not marked


def test_python_entries_are_counted_per_gpu():
    total, first, second = nj.python_entries(), nj.python_entries(device=0), nj.python_entries(device=7)
    _tuning.count_entry(7)
    _tuning.count_entry(7)
    assert nj.python_entries(device=7) == second + 2 and nj.python_entries(device=0) == first
    assert nj.python_entries() == total + 2
    with pytest.raises(NvblasltTypeError, match=r"device: expected a GPU ordinal \(int\) or None, got str"):
        nj.python_entries(device="0")


# ---- the bridge's plan keys, with a stand-in plan ---------------------------------------------------
class _StandIn(StandInEntry):
    """Records what the bridge asked of a plan."""

    made: list = []

    def __init__(self, spec, outputs, pointers, stream, device):
        super().__init__(device, stream)

    def run(self, pointers, out_pointers, stream):
        self.runs.append(stream)


@pytest.fixture
def stand_in(monkeypatch):
    _StandIn.made = []
    monkeypatch.setattr(_bridge, "_Entry", _StandIn)
    monkeypatch.setattr(_bridge, "_latest", {})
    monkeypatch.setattr(_bridge, "_captured", [])
    monkeypatch.setattr(_bridge._local, "plans", {}, raising=False)
    capturing: set = set()
    monkeypatch.setattr(_bridge._cuda, "is_capturing", lambda stream: stream in capturing)
    return capturing


SPEC = object()  # a plan key's static part: the stand-in never reads it


def test_plans_are_kept_per_gpu_and_stream(stand_in):
    _bridge._run(SPEC, (), 0, 100, [256, 512], [1024])
    _bridge._run(SPEC, (), 1, 200, [256, 512], [1024])  # the same GEMM on the other GPU, its own stream
    _bridge._run(SPEC, (), 0, 100, [4352, 8448], [2048])  # other buffers, alike aligned: the same plan
    # a stream handle is unique only while the stream lives: the GPU is in the key, not implied by it
    _bridge._run(SPEC, (), 1, 100, [256, 512], [1024])
    assert [(e.device, e.stream, e.runs) for e in _StandIn.made] == [(0, 100, [100, 100]), (1, 200, [200]),
                                                                     (1, 100, [100])]


def test_a_capture_replays_the_plan_its_first_run_made(stand_in):
    _bridge._run(SPEC, (), 1, 200, [256, 512], [1024])  # XLA's warm-up: uncaptured, on its stream
    stand_in.add(300)  # XLA records the command buffer on a stream of its own
    _bridge._run(SPEC, (), 1, 300, [256, 512], [1024])
    (entry,) = _StandIn.made
    assert entry.runs == [200, 300] and entry.captured and _bridge._captured == [entry]
    _bridge.clear_plans()
    assert not entry.freed and list(_bridge._latest.values()) == [entry]  # a replay still reads it


def test_a_capture_never_plans(stand_in):
    stand_in.add(300)
    with pytest.raises(NvblasltValueError, match=r"stream: XLA is recording a command buffer with an nvblaslt GEMM "
                                                 r"that never ran outside one"):
        _bridge._run(SPEC, (), 0, 300, [256, 512], [1024])
    assert _StandIn.made == []
    _bridge._run(SPEC, (), 1, 200, [256, 512], [1024])
    with pytest.raises(NvblasltValueError, match="never ran outside one"):  # on another GPU: not that plan
        _bridge._run(SPEC, (), 0, 300, [256, 512], [1024])


def test_the_gpu_of_a_stream_is_read_once(monkeypatch):
    asked = []

    class Attributes:
        device = 1

    class Runtime:
        @staticmethod
        def cudaPointerGetAttributes(pointer):
            asked.append(pointer)
            return 0, Attributes()

    monkeypatch.setattr(_bridge._cuda, "cudart", Runtime)
    monkeypatch.setattr(_bridge, "_stream_devices", {})
    assert _bridge.device_of(555, 4096) == 1 and _bridge.device_of(555, 8192) == 1
    assert asked == [4096]
