"""The hot paths' hits without a GPU (issue 33, target 4): what linear()'s no-grad hit, the bound steps'
cache and a bound GEMM's launch do in fewer calls still checks what no key proves, and keeps the
eviction order. Stand-in GEMMs record launches on CPU tensors read as CUDA ones (test_linear_fast_path's
fixture); a bound GEMM runs Launch.run over libc's abs, which returns 0 for a NULL first argument."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import types

import pytest

torch = pytest.importorskip("torch")

from nvblaslt import NvblasltValueError  # noqa: E402
from nvblaslt._launch import Launch, raw_function  # noqa: E402
from nvblaslt.torch import _bound, _ops, _tuning, autotune, linear  # noqa: E402
from tests.cpu.test_linear_fast_path import aligned, seen  # noqa: E402,F401 - seen: the fixture


def _torch_math(monkeypatch) -> None:
    """The checked path's forward as torch math (a copy of x is not 256-byte aligned on the CPU)."""
    monkeypatch.setattr(_ops, "forward_inference", lambda x, weight, bias, activation, cuda:
                        torch.relu(torch.nn.functional.linear(x, weight, bias)))
    monkeypatch.setattr(_ops, "forward_cuda", _ops.forward_composite)  # the op's, under a mode


# ---- linear()'s hit ---------------------------------------------------------------------------------


@pytest.mark.parametrize("negated", ["x", "weight", "bias"])
def test_a_lazy_negation_never_launches_bound(seen, negated):  # noqa: F811
    """A neg-bit view has the key of its base (shape, dtype, device, contiguity): the hit reads the bit,
    and the checked path refuses it by name, as matmul() does, instead of multiplying unnegated memory."""
    tensors = {"x": aligned(16, 64), "weight": aligned(32, 64), "bias": aligned(32)}
    linear(tensors["x"], tensors["weight"], tensors["bias"], "relu")
    linear(tensors["x"], tensors["weight"], tensors["bias"], "relu")
    launched = len(seen.launches)
    tensors[negated] = torch._neg_view(tensors[negated])
    assert tensors[negated].is_neg()
    with pytest.raises(NvblasltValueError, match="negative-bit view"):
        linear(tensors["x"], tensors["weight"], tensors["bias"], "relu")
    assert len(seen.launches) == launched


def test_a_step_whose_forward_could_not_bind_is_never_launched(seen, monkeypatch):  # noqa: F811
    monkeypatch.setattr(_bound, "bind", lambda *args, **kwargs: None)
    _torch_math(monkeypatch)
    x, weight, bias = aligned(16, 64), aligned(32, 64), aligned(32)
    for _ in range(3):  # kept under its key, found by the hit, which takes the checked path
        torch.testing.assert_close(linear(x, weight, bias, "relu"),
                                   torch.relu(torch.nn.functional.linear(x, weight, bias)))
    assert len(_bound.steps()) == 1 and seen.launches == []


def test_modes_and_contexts_are_read_on_every_hit(seen, monkeypatch):  # noqa: F811
    """The inlined plain_eager() and the one contexts_open() query: a function mode, an autotune() and an
    invariant(True) context each leave the bound step alone."""
    from torch.overrides import TorchFunctionMode

    _torch_math(monkeypatch)
    x, weight, bias = aligned(16, 64), aligned(32, 64), aligned(32)
    linear(x, weight, bias, "relu")
    launched = len(seen.launches)
    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        linear(x, weight, bias, "relu")
    assert len(seen.launches) == launched
    with autotune(iterations=1):
        assert _tuning.contexts_open()
        linear(x, weight, bias, "relu")
    with _tuning.invariant(True):
        assert _tuning.contexts_open()
        linear(x, weight, bias, "relu")
    assert len(seen.launches) == launched and not _tuning.contexts_open()
    linear(x, weight, bias, "relu")
    assert len(seen.launches) == launched + 1


def test_contexts_open_starts_closed_in_every_thread():
    found = []
    thread = threading.Thread(target=lambda: found.append((_tuning.contexts_open(),
                                                           _tuning.invariant_options("rows"))))
    with _tuning.invariant(True):  # this thread's context: not the new thread's
        thread.start()
        thread.join()
    assert found == [(False, None)]


# ---- the bound steps' cache ---------------------------------------------------------------------------


@pytest.fixture
def steps(monkeypatch):
    monkeypatch.setattr(_bound, "_CACHE_SIZE", 3)
    monkeypatch.setattr(_bound._cuda, "is_capturing", lambda stream: stream == 9)
    _bound.clear()
    yield
    _bound.clear()


def test_the_least_recently_found_step_leaves_first(steps):
    made = {key: _bound.step(key, 0, lambda key=key: f"step {key}") for key in "abc"}
    assert _bound.find("a", 0) == made["a"]  # a is now the most recently used: b is the oldest
    _bound.step("d", 0, lambda: "step d")
    assert list(_bound.steps()) == [("c", 0), ("a", 0), ("d", 0)]
    assert _bound.find("b", 0) is None
    _bound.find("c", 0)
    _bound.step("e", 0, lambda: "step e")
    assert list(_bound.steps()) == [("d", 0), ("c", 0), ("e", 0)]


def test_clear_plan_cache_forgets_this_thread_s_bound_steps_but_captured_ones(steps):
    import nvblaslt

    _bound.step("a", 0, lambda: ["step a"])
    captured = _bound.step("a", 9, lambda: pytest.fail("planned inside a capture"))  # borrowed and kept
    nvblaslt.clear_plan_cache()
    assert _bound.steps() == {} and _bound.find("a", 0) is None  # made again on its next use
    assert any(kept is captured for kept in _bound._local.captured)  # a graph's replay still reads it
    made = _bound.step("a", 0, lambda: ["step a, again"])
    assert made == ["step a, again"]


def test_a_capture_borrows_the_least_recently_used_step_of_its_key(steps):
    first = _bound.step("k", 0, lambda: ["made on stream 0"])
    second = _bound.step("k", 1, lambda: ["made on stream 1"])
    _bound.find("k", 0)  # stream 1's is now the least recently used
    assert _bound.step("k", 9, lambda: pytest.fail("planned inside a capture")) is second
    assert any(kept is second for kept in _bound._local.captured) and first is not second
    assert _bound.step("other", 9, lambda: pytest.fail("planned inside a capture")) is None


# ---- a bound GEMM's launch ----------------------------------------------------------------------------


class _Plan:
    """What BoundGemm reads of a plan: its launch (Launch.run over libc's abs), recording vector writes."""

    def __init__(self, swapped: bool):
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        launch = Launch.__new__(Launch)
        launch.matmul = raw_function(libc.abs)
        launch.a_pointer, launch.b_pointer = ctypes.c_void_p(), ctypes.c_void_p()
        launch.d_argument, launch.stream_argument = ctypes.c_void_p(), ctypes.c_void_p()
        null = ctypes.c_void_p.from_param(None)  # abs(NULL) == 0: a launch that succeeded
        launch.arguments = (null, launch.a_pointer, launch.b_pointer, launch.d_argument, launch.stream_argument)
        launch.problem = types.SimpleNamespace(a=types.SimpleNamespace(source="b" if swapped else "a"))
        self.written: list[tuple[str, int]] = []
        launch.pointer_setter = lambda name: (lambda pointer: self.written.append((name, pointer)))
        self._launch = launch


@pytest.mark.parametrize("swapped", [False, True])
def test_a_bound_gemm_writes_a_vector_only_when_it_changes(swapped):
    plan = _Plan(swapped)
    gemm = _bound.BoundGemm(plan, ("BIAS_POINTER", "EPILOGUE_AUX_POINTER"))  # type: ignore[arg-type]
    launch = plan._launch
    for a, bias, aux in ((256, 4096, 8192), (512, 4096, 8192), (512, 4352, 8192), (512, 4352, 8448)):
        gemm(a, 1024, 2048, 7, bias, aux)
        assert (launch.a_pointer.value, launch.b_pointer.value) == ((1024, a) if swapped else (a, 1024))
        assert (launch.d_argument.value, launch.stream_argument.value) == (2048, 7)
    assert plan.written == [("BIAS_POINTER", 4096), ("EPILOGUE_AUX_POINTER", 8192), ("BIAS_POINTER", 4352),
                            ("EPILOGUE_AUX_POINTER", 8448)]


def test_a_bound_gemm_whose_vector_write_fails_writes_it_again_next_time():
    plan = _Plan(False)
    gemm = _bound.BoundGemm(plan, ("BIAS_POINTER",))  # type: ignore[arg-type]
    failing = [True]

    def setter(pointer):
        if failing.pop() if failing else False:
            raise RuntimeError("descriptor write refused")
        plan.written.append(("BIAS_POINTER", pointer))
    gemm._setters = (setter,)
    with pytest.raises(RuntimeError):
        gemm(256, 512, 768, 0, 4096)
    gemm(256, 512, 768, 0, 4096)
    assert plan.written == [("BIAS_POINTER", 4096)]


def test_a_bound_gemm_hands_a_refused_launch_to_the_launch_s_fallback():
    """BoundGemm makes Launch.run's call itself: a status other than 0 goes to Launch.recover (the next
    algorithm, or the error), with this call's pointers in place."""
    plan = _Plan(False)
    launch = plan._launch
    launch.arguments = (ctypes.c_void_p.from_param(7), *launch.arguments[1:])  # abs(7): status 7
    seen_status = []
    launch.recover = lambda status: seen_status.append((status, launch.d_argument.value))
    _bound.BoundGemm(plan, ())(256, 512, 768, 0)  # type: ignore[arg-type]
    assert seen_status == [(7, 768)]


def test_export_traces_the_op_after_eager_like_calls():
    """linear()'s fast path asks dynamo alone (not export's flag): non-strict export's fake tensors and modes
    still take the op, after eager calls with the same shapes have been recorded."""
    torch.manual_seed(0)
    weight, bias = torch.randn(4, 5, requires_grad=True), torch.randn(4, requires_grad=True)

    class Layer(torch.nn.Module):
        def forward(self, x):
            return linear(x, weight, bias, "relu")
    x = torch.randn(3, 5)
    for _ in range(2):
        Layer()(x)
    with torch.no_grad():
        Layer()(x)
    exported = torch.export.export(Layer(), (x,), strict=False)
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert "nvblaslt.linear.default" in targets
    torch.testing.assert_close(exported.module()(x), torch.relu(torch.nn.functional.linear(x, weight, bias)))


# ---- matmul()'s hit -----------------------------------------------------------------------------------


def test_matmul_asks_for_a_type_s_fast_reader_once(monkeypatch):
    """matmul() keeps fast_reader()'s answer per array type (no call per hit); a type without a reader
    (None, kept too) takes the checked path, which says what is wrong with a non-array."""
    from nvblaslt import NvblasltTypeError, _function_form, matmul

    asked = []

    class Odd:
        pass

    monkeypatch.setattr(_function_form, "_readers", {})
    monkeypatch.setattr(_function_form, "fast_reader", lambda a: asked.append(type(a)) or None)
    for _ in range(3):
        with pytest.raises(NvblasltTypeError):
            matmul(Odd(), Odd())
    assert asked == [Odd] and _function_form._readers == {Odd: None}
