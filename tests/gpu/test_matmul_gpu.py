"""The matmul layer on a GPU, against float64 references on fresh random inputs."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import nvblaslt
from nvblaslt import CublasLtError, Matmul, MatmulEpilog, matmul
from tests.reference import gelu, gelu_grad, host, host_exact, rel_error, unpack_relu_mask

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TOL = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 3e-2, "float64": 1e-12}
RNG = np.random.default_rng()


def rand(shape, dtype, layout="row", scale=1.0):
    """A fresh random torch tensor of logical ``shape``, stored row- or column-major."""
    stored = shape if layout == "row" else (*shape[:-2], shape[-1], shape[-2])
    t = torch.from_numpy(RNG.standard_normal(stored) * scale).to(getattr(torch, dtype)).cuda()
    return t if layout == "row" else t.transpose(-1, -2)


M, N, K, B = 96, 48, 40, 3
FORWARD = ["DEFAULT", "RELU", "RELU_AUX", "BIAS", "RELU_BIAS", "RELU_AUX_BIAS", "GELU", "GELU_AUX", "GELU_BIAS",
           "GELU_AUX_BIAS"]


def forward_reference(name, a, b, bias):
    z = host(a) @ host(b)
    if "BIAS" in name:
        z = z + host(bias)[..., :, None]
    if "RELU" in name:
        return np.maximum(z, 0), z
    if "GELU" in name:
        return gelu(z), z
    return z, z


@pytest.mark.parametrize("batched", [False, True], ids=["2d", "batched"])
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", FORWARD)
def test_forward_epilogs(name, dtype, layout, batched):
    batch = (B,) if batched else ()
    a, b = rand((*batch, M, K), dtype, layout), rand((*batch, K, N), dtype, layout)
    bias = rand((*batch, M), dtype) if "BIAS" in name else None
    inputs = {"bias": bias} if bias is not None else None
    result = matmul(a, b, epilog=MatmulEpilog[name], epilog_inputs=inputs)
    expected, preactivation = forward_reference(name, a, b, bias)
    if "AUX" in name:
        d, aux = result
        assert list(aux) == (["relu_aux"] if "RELU" in name else ["gelu_aux"])
        if "RELU" in name:
            mask = unpack_relu_mask(host(aux["relu_aux"]), M)
            decided = np.abs(preactivation) > 1e-2 * np.abs(preactivation).max()
            assert (mask == (preactivation > 0))[decided].all()
        else:
            assert rel_error(host(aux["gelu_aux"])[..., :M, :], preactivation) < TOL[dtype]
    else:
        d = result
    assert isinstance(d, torch.Tensor) and d.shape == (*batch, M, N) and str(d.dtype) == f"torch.{dtype}"
    assert rel_error(host(d), expected) < TOL[dtype]


@pytest.mark.parametrize("k", [8, 64])
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["RELU_AUX", "GELU_AUX", "RELU_AUX_BIAS", "GELU_AUX_BIAS"])
def test_aux_epilogs_with_one_row(name, dtype, layout, k):
    """M=1 in 16 bits: cuBLASLt refused these at launch until the heuristics saw the aux pointer set."""
    a, b = rand((1, k), dtype, layout), rand((k, 24), dtype, layout)
    bias = rand((1,), dtype) if "BIAS" in name else None
    d, aux = matmul(a, b, epilog=name, epilog_inputs={"bias": bias} if bias is not None else None)
    expected, preactivation = forward_reference(name, a, b, bias)
    assert d.shape == (1, 24) and rel_error(host(d), expected) < TOL[dtype]
    if "RELU" in name:
        mask = unpack_relu_mask(host(aux["relu_aux"]), 1)
        decided = np.abs(preactivation) > 1e-2 * np.abs(preactivation).max()
        assert (mask == (preactivation > 0))[decided].all()
    else:
        assert rel_error(host(aux["gelu_aux"])[..., :1, :], preactivation) < TOL[dtype]


@pytest.mark.parametrize("batched", [False, True], ids=["2d", "batched"])
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation", ["RELU", "GELU"])
@pytest.mark.parametrize("bgrad", [False, True], ids=["plain", "bgrad"])
def test_backward_epilogs_round_trip(activation, bgrad, dtype, layout, batched):
    """Forward *_AUX_BIAS makes the aux; backward D*/D*_BGRAD consumes it as is."""
    batch = (B,) if batched else ()
    x, w = rand((*batch, M, K), dtype, layout), rand((*batch, K, N), dtype, layout)
    bias = rand((*batch, M), dtype)
    _, aux = matmul(x, w, epilog=f"{activation}_AUX_BIAS", epilog_inputs={"bias": bias})
    key = "relu_aux" if activation == "RELU" else "gelu_aux"
    g1, g2 = rand((*batch, M, K), dtype, layout), rand((*batch, K, N), dtype, layout)
    name = f"D{activation}" + ("_BGRAD" if bgrad else "")
    result = matmul(g1, g2, epilog=name, epilog_inputs={key: aux[key]})
    d, outputs = result if bgrad else (result, {})
    z = host(x) @ host(w) + host(bias)[..., :, None]
    grad = host(g1) @ host(g2)
    # the epilog sees the pre-activation as stored (in dtype), so take the derivative from that
    stored = host(aux[key])[..., :M, :] if key == "gelu_aux" else z
    expected = grad * (stored > 0) if activation == "RELU" else grad * gelu_grad(stored)
    if activation == "RELU":
        decided = np.abs(z) > 1e-2 * np.abs(z).max()
        expected = np.where(decided, expected, host(d))  # a sign at ~0 may round either way
    assert rel_error(host(d), expected) < 3 * TOL[dtype]
    if bgrad:
        assert list(outputs) == [f"d{activation.lower()}_bgrad"]
        gradient = outputs[f"d{activation.lower()}_bgrad"]  # (M,), or (…, M, 1) batched, as nvmath-python gives
        assert tuple(gradient.shape) == ((*batch, M, 1) if batched else (M,))
        assert rel_error(host(gradient).reshape(*batch, M), expected.sum(axis=-1)) < 3 * TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("which,layouts", [("BGRADA", ("col", "row")), ("BGRADA", ("col", "col")),
                                           ("BGRADB", ("row", "row")), ("BGRADB", ("col", "row"))])
def test_bias_gradient_epilogs(which, layouts, dtype):
    """BGRADA sums A over K (length M); BGRADB sums B over K (length N) — cuBLASLt's definitions."""
    a, b = rand((M, K), dtype, layouts[0]), rand((K, N), dtype, layouts[1])
    d, aux = matmul(a, b, epilog=which)
    expected = host(a).sum(axis=1) if which == "BGRADA" else host(b).sum(axis=0)
    assert list(aux) == [which.lower()]
    assert rel_error(host(aux[which.lower()]), expected) < 3 * TOL[dtype]
    assert rel_error(host(d), host(a) @ host(b)) < TOL[dtype]


@pytest.mark.parametrize("which,layouts", [("BGRADA", ("row", "col")), ("BGRADB", ("row", "col"))])
def test_bias_gradient_in_other_layouts_is_right_or_refused_clearly(which, layouts):
    """Layouts cuBLASLt 13.1 had no kernel for: nvblaslt now reaches some through the transposed problem
    or cuBLASLt's row-major order; what stays without a kernel is refused, naming the epilog (an xfail
    saying which)."""
    a, b = rand((M, K), "float32", layouts[0]), rand((K, N), "float32", layouts[1])
    try:
        d, aux = matmul(a, b, epilog=which)
    except CublasLtError as error:
        assert error.status_name == "CUBLAS_STATUS_NOT_SUPPORTED" and "BGRAD" in str(error), error
        pytest.xfail(f"cuBLASLt refused {which} with a {layouts[0]}-major A and a {layouts[1]}-major B "
                     f"({error.status_name})")
    expected = host(a).sum(axis=1) if which == "BGRADA" else host(b).sum(axis=0)
    assert rel_error(host(aux[which.lower()]), expected) < 1e-5
    assert rel_error(host(d), host(a) @ host(b)) < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_alpha_beta_with_c(dtype):
    a, b = rand((M, K), dtype), rand((K, N), dtype)
    c = rand((M, N), dtype, "col")
    d = matmul(a, b, c, alpha=0.5, beta=-2.0)
    assert rel_error(host(d), 0.5 * host(a) @ host(b) - 2.0 * host(c)) < TOL[dtype]
    mm = Matmul(a, b, c, alpha=0.5, beta=-2.0)
    mm.plan()
    out = mm.execute(out=c)  # in place: D is C
    assert out is c
    mm.free()


def test_tf32_compute_is_selectable():
    a, b = rand((256, 512), "float32"), rand((512, 128), "float32")
    exact = rel_error(host(matmul(a, b)), host(a) @ host(b))
    fast = rel_error(host(matmul(a, b, compute_type="tf32")), host(a) @ host(b))
    assert exact < 1e-5 and 1e-5 < fast < 3e-3


def test_fp8_with_scales():
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        pytest.skip("this torch has no float8")
    a = (torch.randn(128, 64, device="cuda") * 4).to(fp8)  # row-major A, column-major B: the TN layout fp8 needs
    b = (torch.randn(96, 64, device="cuda") * 4).to(fp8).t()
    d = matmul(a, b, quantization_scales={"a": 0.5, "b": 0.25}, result_type="float32")
    ref = host(a.to(torch.float32)) @ host(b.to(torch.float32)) * 0.125
    assert d.dtype == torch.float32 and rel_error(host(d), ref) < 5e-4  # Hopper fp8 kernels accumulate in stages


@pytest.mark.parametrize("shapes", [((M, K), (K, N)), ((3, M, K), (3, K, N)), ((1, K), (K, N)), ((M, K), (K, 1)),
                                    ((M, K), (K,))])
@pytest.mark.parametrize("order", ["C", "F"])
def test_cupy_results_are_laid_out_as_planned(shapes, order):
    """CuPy results are built by their order when dense C/F (faster) and by strides otherwise: either
    way the array must have the plan's layout and every element written."""
    cupy = pytest.importorskip("cupy")
    def matrix(shape):  # C order, or F order per matrix (batch outermost)
        x = cupy.asarray(RNG.standard_normal(shape), dtype=cupy.float32)
        return cupy.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2) if order == "F" and x.ndim > 1 else x

    a, b = (matrix(s) for s in shapes)
    with Matmul(a, b) as mm:
        mm.plan()
        for _ in range(2):
            d = mm.execute()
            assert d.shape == mm._problem.result_shape
            assert d.strides == tuple(s * d.itemsize for s in mm._problem.result_strides)
            assert rel_error(d.get(), np.matmul(a.get(), b.get())) < 1e-5


def test_cupy_torch_jax_and_protocol_results_come_back_in_kind():
    cupy = pytest.importorskip("cupy")
    a, b = cupy.asarray(RNG.standard_normal((M, K)), dtype=cupy.float32), cupy.asarray(
        RNG.standard_normal((K, N)), dtype=cupy.float32)
    bias = cupy.asarray(RNG.standard_normal(M), dtype=cupy.float32)
    d, aux = matmul(a, b, epilog=MatmulEpilog.RELU_AUX_BIAS, epilog_inputs={"bias": bias})
    assert isinstance(d, cupy.ndarray) and isinstance(aux["relu_aux"], cupy.ndarray)
    assert aux["relu_aux"].dtype == cupy.uint8
    assert rel_error(d.get(), np.maximum(a.get() @ b.get() + bias.get()[:, None], 0)) < 1e-5
    jax = pytest.importorskip("jax")
    ja, jb = jax.numpy.asarray(a.get()), jax.numpy.asarray(b.get())
    jd = matmul(ja, jb, epilog="RELU")
    assert isinstance(jd, jax.Array)
    assert rel_error(np.asarray(jd), np.maximum(a.get() @ b.get(), 0)) < 1e-5

    class Protocol:  # only the CUDA Array Interface: no framework behind it
        def __init__(self, array):
            self.__cuda_array_interface__ = array.__cuda_array_interface__
            self._keep = array

    pd = matmul(Protocol(a), Protocol(b))
    assert isinstance(pd, nvblaslt.DeviceArray)
    assert hasattr(pd, "__dlpack__") and hasattr(pd, "__cuda_array_interface__")
    assert rel_error(cupy.asarray(pd).get(), a.get() @ b.get()) < 1e-5


def test_non_default_stream_and_out():
    stream = torch.cuda.Stream()
    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    out = torch.full((M, N), float("nan"), device="cuda")  # poisoned; row-major, as D takes A's order
    with torch.cuda.stream(stream):
        result = matmul(a, b, out=out, stream=stream)
    stream.synchronize()
    assert result is out
    assert rel_error(host(out), host(a) @ host(b)) < 1e-5


def test_stateful_reexecute_after_in_place_change_and_reset_operands():
    a, b = rand((M, K), "float16"), rand((K, N), "float16")
    bias = rand((M,), "float16")
    with Matmul(a, b) as mm:
        algorithms = mm.plan(epilog=MatmulEpilog.RELU_BIAS, epilog_inputs={"bias": bias})
        assert algorithms and algorithms[0].workspace_size >= 0
        first = mm.execute()
        a.copy_(rand((M, K), "float16"))  # same memory, new values
        second = mm.execute()
        ref = np.maximum(host(a) @ host(b) + host(bias)[:, None], 0)
        assert rel_error(host(second), ref) < 5e-3 and not torch.equal(first, second)
        a2, bias2 = rand((M, K), "float16"), rand((M,), "float16")
        mm.reset_operands(a=a2, epilog_inputs={"bias": bias2})
        ref2 = np.maximum(host(a2) @ host(b) + host(bias2)[:, None], 0)
        assert rel_error(host(mm.execute()), ref2) < 5e-3
        timings = mm.autotune(iterations=3)
        assert len(timings) == len(algorithms) and timings[0][1] <= timings[-1][1]
        assert rel_error(host(mm.execute()), ref2) < 5e-3
    with pytest.raises(nvblaslt.NvblasltValueError, match="freed"):
        mm.execute()


def test_descriptor_level_heuristics_caps_and_config():
    lib = nvblaslt.library()
    api = lib.api
    handle = nvblaslt.Handle.for_device(0)
    with nvblaslt.MatmulDesc(api.CUBLAS_COMPUTE_32F, api.CUDA_R_32F) as desc, \
            nvblaslt.MatrixLayout(api.CUDA_R_16F, 1024, 512, 1024) as la, \
            nvblaslt.MatrixLayout(api.CUDA_R_16F, 512, 256, 512) as lb, \
            nvblaslt.MatrixLayout(api.CUDA_R_16F, 1024, 256, 1024) as lc, \
            nvblaslt.MatmulPreference(max_workspace_bytes=1 << 25) as pref:
        results = nvblaslt.heuristics(handle, desc, la, lb, lc, lc, pref, count=4)
    assert results
    algo = results[0].algorithm
    assert algo.id >= 0 and algo.tile and algo.stages
    tiles = algo.capability("TILE_IDS")
    assert isinstance(tiles, list) and all(isinstance(t, int) for t in tiles)
    assert algo.capability("EPILOGUE_MASK") & api.CUBLASLT_EPILOGUE_RELU_BIAS
    config = algo.config()
    algo.set("SPLITK_NUM", config["SPLITK_NUM"])
    assert algo.get("SPLITK_NUM") == config["SPLITK_NUM"]


def test_threads_each_with_their_own_plans_and_streams():
    import threading

    errors, results = [], {}

    def work(index):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                a, b = rand((64 + index, 32), "float32"), rand((32, 48), "float32")
                bias = rand((64 + index,), "float32")
                for _ in range(20):
                    d = matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
                stream.synchronize()
                ref = np.maximum(host(a) @ host(b) + host(bias)[:, None], 0)
                results[index] = rel_error(host(d), ref)
        except Exception as exc:  # reported below, with the thread's index
            errors.append((index, exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 8 and max(results.values()) < 1e-5


def test_execute_captured_in_a_cuda_graph_replays_with_new_values():
    """Inside a graph the pointers are fixed: new values go into the same arrays (in place)."""
    a, b = rand((M, K), "float16"), rand((K, N), "float16")
    bias = rand((M,), "float16")
    out = torch.empty(N, M, device="cuda", dtype=torch.float16).t()
    mm = Matmul(a, b)
    mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
    mm.execute(out=out)  # first run outside the capture: checks out=, warms up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mm.execute(out=out, stream=torch.cuda.current_stream())
    for _ in range(3):
        a.copy_(rand((M, K), "float16"))
        bias.copy_(rand((M,), "float16"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = np.maximum(host(a) @ host(b) + host(bias)[:, None], 0)
        assert rel_error(host(out), ref) < 5e-3
    mm.free()


def test_function_form_rebinds_new_arrays_and_keeps_none_alive():
    import gc
    import weakref

    refs = []
    for _ in range(4):  # same shapes: one plan, new pointers every call (the fast path after the first)
        a, b, bias = rand((M, K), "float32"), rand((K, N), "float32"), rand((M,), "float32")
        d = matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias}, alpha=0.5)
        ref = np.maximum(0.5 * host(a) @ host(b) + host(bias)[:, None], 0)
        assert rel_error(host(d), ref) < 1e-5
        refs.append(weakref.ref(a))
        del a, b, bias, d
    gc.collect()
    alive = [r() for r in refs if r() is not None]
    def describe(holder):
        if type(holder).__name__ == "frame":
            owners = [type(o).__name__ for o in gc.get_referrers(holder) if o is not holders]
            return f"frame of {holder.f_code.co_qualname} (line {holder.f_lineno}) held by {owners[:4]}"
        return type(holder).__name__

    holders: list = []
    me = sys._getframe()
    holders += [describe(h) for x in alive for h in gc.get_referrers(x) if h is not alive and h is not me]
    assert not alive, f"a cached plan kept {len(alive)} of the caller's arrays alive; held by {holders}"


def test_function_form_sees_an_array_changed_in_place_structurally():
    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    matmul(a, b)
    a.set_(rand((M, K), "float32"))  # same tensor object, new storage
    assert rel_error(host(matmul(a, b)), host(a) @ host(b)) < 1e-5


def test_function_form_fast_path_takes_parameters_and_notices_each_change(monkeypatch):
    from nvblaslt import _function_form

    _function_form.clear_plan_cache()  # plans cached by earlier tests would hide the checked calls counted here
    w = torch.nn.Parameter(rand((M, K), "float32"), requires_grad=False)  # nn.Linear's weight type
    bias = rand((M,), "float32")
    matmul(w, rand((N, K), "float32").T, epilog="RELU_BIAS", epilog_inputs={"bias": bias})  # plans
    checked = []
    real = _function_form._checked_call
    monkeypatch.setattr(_function_form, "_checked_call", lambda *args: checked.append(1) or real(*args))

    def run(a, b, bias):
        d = matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert rel_error(host(d), np.maximum(host(a) @ host(b) + host(bias)[:, None], 0)) < 1e-5
        return len(checked)

    x = rand((N, K), "float32")
    assert run(w, x.T, bias) == 0  # a fresh view of new activations: the cached plan, no re-reading
    assert run(w, rand((N, K), "float32").T, rand((M,), "float32")) == 0
    # every change of layout, dtype or lazy view leaves the fast key and is read (and planned) again
    assert run(w, rand((K, N), "float32"), bias) == 1  # row-major b instead of a transposed view
    assert run(w.detach().T.contiguous().T, x.T, bias) == 2  # column-major a
    assert run(w[:, : K - 8], x.T[: K - 8], bias) == 3  # another K, strided a
    complex_w = torch.complex(w.detach(), rand((M, K), "float32"))
    complex_b = torch.complex(rand((K, N), "float32"), rand((K, N), "float32"))
    d = matmul(complex_w.conj(), complex_b)  # a lazy conjugate view takes the checked path
    expected = np.conj(host_exact(complex_w)) @ host_exact(complex_b)
    assert np.linalg.norm(host_exact(d) - expected) / np.linalg.norm(expected) < 1e-5
    assert len(checked) == 4


def test_the_fast_path_rebinds_whatever_changed_since_its_last_call():
    """The fast path skips rebinding when the same arrays come back with the default scalars: a
    scalar given in between, or another call's operands bound through the checked path, must not
    leak into the next call."""
    from nvblaslt import _function_form

    _function_form.clear_plan_cache()
    a, b, c = rand((M, K), "float32"), rand((K, N), "float32"), rand((M, N), "float32")
    a2, b2 = rand((M, K), "float32"), rand((K, N), "float32")
    product, product2 = host(a) @ host(b), host(a2) @ host(b2)
    for alpha, expected in ((None, product), (None, product), (3.0, 3 * product), (None, product)):
        assert rel_error(host(matmul(a, b, alpha=alpha)), expected) < 1e-5
    stream = torch.cuda.current_stream()  # stream= takes the checked path, onto the same cached plan
    assert rel_error(host(matmul(a2, b2, stream=stream)), product2) < 1e-5
    assert rel_error(host(matmul(a, b)), product) < 1e-5  # the same pointers as two calls ago: bound again
    for beta in (0.5, 0.5, 2.0):
        assert rel_error(host(matmul(a, b, c, beta=beta)), product + beta * host(c)) < 1e-5
    _function_form.clear_plan_cache()
    assert rel_error(host(matmul(a, b)), product) < 1e-5  # no stale last plan after the cache is cleared


def test_tensors_that_require_grad_are_read_as_nvmath_python_reads_them():
    """nn.Linear's parameters require grad; DLPack refuses to export them, nvmath-python reads them."""
    w = torch.nn.Parameter(rand((M, K), "float32"))
    bias = torch.nn.Parameter(rand((M,), "float32"))
    x = rand((N, K), "float32").requires_grad_()
    expected = np.maximum(host(w) @ host(x).T + host(bias)[:, None], 0)
    for _ in range(2):  # the checked path, then the cached plan's fast path
        d = matmul(w, x.T, epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert not d.requires_grad and rel_error(host(d), expected) < 1e-5
    with Matmul(w, x.T) as mm:
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert rel_error(host(mm.execute()), expected) < 1e-5


def _drelu_bgrad_problem():
    x, w, bias = rand((M, K), "float32", "col"), rand((K, N), "float32", "col"), rand((M,), "float32")
    _, aux = matmul(x, w, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
    g1, g2 = rand((M, K), "float32", "col"), rand((K, N), "float32", "col")
    z = host(x) @ host(w) + host(bias)[:, None]
    expected = (host(g1) @ host(g2)) * (z > 0)
    decided = np.abs(z) > 1e-3 * np.abs(z).max()
    return g1, g2, aux, expected, decided


def test_the_split_bias_gradient_form_takes_each_calls_operands():
    """A plan that recalled the two-call DRELU_BGRAD form (a search found it faster) must run it on
    the operands of each call, in the function form and after reset_operands alike."""
    from nvblaslt import _function_form
    _function_form.clear_plan_cache()
    g1, g2, aux, _, _ = _drelu_bgrad_problem()
    matmul(g1, g2, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})
    (plan,) = {p for p in _function_form._local.plans.values() if p._epilog.name == "DRELU_BGRAD"}
    plan._split_form = plan._make_split_form(iterations=0)  # what a remembered search makes of the plan
    for _ in range(2):  # the checked path's cache hit, then the fast path
        g1, g2, aux, expected, decided = _drelu_bgrad_problem()
        d, out = matmul(g1, g2, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})
        got = host(d)
        assert rel_error(np.where(decided, got, expected), expected) < 1e-5
        assert rel_error(host(out["drelu_bgrad"]), np.where(decided, got, expected).sum(axis=1)) < 1e-4
    g1, g2, aux, expected, decided = _drelu_bgrad_problem()
    with Matmul(g1, g2) as mm:
        mm.plan(epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})
        mm._split_form = mm._make_split_form(iterations=0)
        g1b, g2b, auxb, expected, decided = _drelu_bgrad_problem()
        mm.reset_operands(g1b, g2b, epilog_inputs={"relu_aux": auxb["relu_aux"]})
        d, _ = mm.execute()
        assert rel_error(np.where(decided, host(d), expected), expected) < 1e-5
        mm.plan(epilog="DEFAULT")  # planning again leaves the two-call form behind
        assert mm._split_form is None
        assert rel_error(host(mm.execute()), host(g1b) @ host(g2b)) < 1e-5


def test_a_split_form_attached_after_fast_calls_runs_on_the_next_calls_arrays():
    """The masking plan of a split form starts from the plan's operands, which the fast path does not
    update: attached after fast calls, the next call with the same arrays must still reach it."""
    from nvblaslt import _function_form
    _function_form.clear_plan_cache()
    g1, g2, aux, _, _ = _drelu_bgrad_problem()
    matmul(g1, g2, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})  # planned on these
    h1, h2, haux, expected, decided = _drelu_bgrad_problem()
    for _ in range(2):  # the fast path binds h's arrays, then finds them bound
        matmul(h1, h2, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": haux["relu_aux"]})
    (plan,) = {p for p in _function_form._local.plans.values() if p._epilog.name == "DRELU_BGRAD"}
    plan._split_form = plan._make_split_form(iterations=0)
    d, out = matmul(h1, h2, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": haux["relu_aux"]})
    got = host(d)
    assert rel_error(np.where(decided, got, expected), expected) < 1e-5
    assert rel_error(host(out["drelu_bgrad"]), np.where(decided, got, expected).sum(axis=1)) < 1e-4
    _function_form.clear_plan_cache()


def test_a_failed_workspace_allocation_leaves_the_plan_whole(monkeypatch):
    from nvblaslt import _launch

    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    with Matmul(a, b) as mm:
        mm.plan()
        launch = mm._launch
        old = launch.workspace
        grown = (old.size if old is not None else 0) + (1 << 20)

        def out_of_memory(*args, **kwargs):
            raise MemoryError("cudaMallocAsync: out of memory (simulated)")
        monkeypatch.setattr(_launch, "DeviceBuffer", out_of_memory)
        with pytest.raises(MemoryError):
            launch.ensure_workspace(grown, mm.stream)  # what autotune's search does for a challenger needing more
        monkeypatch.undo()
        assert launch.workspace is old and (old is None or old._finalizer.alive)
        assert rel_error(host(mm.execute()), host(a) @ host(b)) < 1e-5
        launch.ensure_workspace(grown, mm.stream)  # grown for real: the launch arguments take the new buffer
        assert launch.workspace.size == grown and (old is None or not old._finalizer.alive)
        assert launch.workspace_size in (0, grown)
        assert rel_error(host(mm.execute()), host(a) @ host(b)) < 1e-5


def test_a_failed_re_plan_leaves_the_previous_plan_whole(monkeypatch):
    from nvblaslt import _plan

    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    bias = rand((M,), "float32").cpu().numpy()  # a host input is staged again by the new plan
    with Matmul(a.cpu().numpy(), b.cpu().numpy()) as mm:
        mm.plan(epilog="BIAS", epilog_inputs={"bias": bias})
        expected = host(a) @ host(b) + bias[:, None]
        assert rel_error(mm.execute(), expected) < 1e-5

        def fail(*args, **kwargs):
            raise RuntimeError("simulated failure while planning again")
        monkeypatch.setattr(_plan, "Results", fail)
        with pytest.raises(RuntimeError, match="simulated"):
            mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})  # fails before anything is committed
        monkeypatch.undo()
        assert rel_error(mm.execute(), expected) < 1e-5  # the BIAS plan, its staged bias intact
        mm.plan(epilog="RELU_BIAS", epilog_inputs={"bias": bias})
        assert rel_error(mm.execute(), np.maximum(expected, 0)) < 1e-5


def test_the_plan_cache_keeps_the_plans_in_use():
    from nvblaslt import _function_form

    _function_form.clear_plan_cache()
    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    matmul(a, b)
    matmul(a, b)  # now on the fast path
    hot = set(_function_form._local.plans.values())
    for k in range(1, 2 * _function_form._CACHE_SIZE + 8):  # more problems than the cache holds
        matmul(rand((4, k), "float32"), rand((k, 4), "float32"))
        matmul(a, b)
    assert hot <= set(_function_form._local.plans.values())  # used all along: never evicted
    _function_form.clear_plan_cache()


def test_out_is_checked_again_when_the_operands_change():
    x, w = rand((M, K), "float32"), rand((K, K), "float32")
    buf = matmul(x, w)
    matmul(x, w, out=buf)
    with pytest.raises(nvblaslt.NvblasltValueError, match="overlaps a"):
        matmul(buf, w, out=buf)  # the cached plan's out= check must not be reused for a new a
    with Matmul(x, w) as mm:
        mm.plan()
        mm.execute(out=buf)
        mm.reset_operands(a=buf)
        with pytest.raises(nvblaslt.NvblasltValueError, match="overlaps a"):
            mm.execute(out=buf)


def test_a_refused_reset_leaves_the_plan_on_its_operands():
    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    with Matmul(a, b) as mm:
        mm.plan()
        with pytest.raises(nvblaslt.NvblasltValueError, match="b: The extents .* must match"):
            mm.reset_operands(a=rand((M, K), "float32"), b=rand((K, N + 1), "float32"))
        assert rel_error(host(mm.execute()), host(a) @ host(b)) < 1e-5


def test_an_epilog_input_the_epilog_does_not_take_is_refused_on_every_call():
    """nvmath-python 1.0 refuses an extra epilog_inputs key (ValueError): so does every path here, the
    function form's cache hit and fast path included, after a call that planned without the key."""
    from nvblaslt import _function_form

    _function_form.clear_plan_cache()
    a, b, bias = rand((M, K), "float32"), rand((K, N), "float32"), rand((M,), "float32")
    expected = np.maximum(host(a) @ host(b) + host(bias)[:, None], 0)
    for _ in range(3):  # the first plan, then the checked path's cache hit, then the fast path
        assert rel_error(host(matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias})), expected) < 1e-5
        with pytest.raises(ValueError, match=r"RELU_BIAS takes \['bias'\]; got also \['gelu_aux'\]"):
            matmul(a, b, epilog="RELU_BIAS", epilog_inputs={"bias": bias, "gelu_aux": rand((M, N), "float32")})
    with Matmul(a, b) as mm, pytest.raises(ValueError, match="got also"):
        mm.plan(epilog="DEFAULT", epilog_inputs={"bias": bias})


def test_autotune_leaves_out_an_algorithm_refused_at_launch():
    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    with Matmul(a, b) as mm:
        found = mm.plan(preferences={"limit": 4})
        if len(found) < 2:
            pytest.skip("the heuristics offered one algorithm")
        victim = found[1]
        real = mm._launch.matmul
        refused = int(nvblaslt.library().api.CUBLAS_STATUS_NOT_SUPPORTED)
        mm._launch.matmul = lambda *arguments: refused if mm.algorithm is victim else real(*arguments)
        timings = mm.autotune(iterations=2)
        assert all(r is not victim for r, _ in timings) and all(r is not victim for r in mm.algorithms)
        assert rel_error(host(mm.execute()), host(a) @ host(b)) < 1e-5


def test_a_launch_refused_at_run_time_retries_with_this_calls_operands():
    """cuBLASLt may refuse an offered algorithm at launch; the retry with the next one must use the
    pointers of this call, not those the plan was made with."""
    from nvblaslt import _function_form

    _function_form.clear_plan_cache()
    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    matmul(a, b)
    (plan,) = set(_function_form._local.plans.values())  # under its checked key and its fast key
    if len(plan.algorithms) < 2:
        pytest.skip("the heuristics offered one algorithm")
    first = plan.algorithm
    real, refusals = plan._launch.matmul, []

    def refuse_once(*arguments):
        if refusals:
            return real(*arguments)
        refusals.append(arguments)
        return int(nvblaslt.library().api.CUBLAS_STATUS_NOT_SUPPORTED)
    plan._launch.matmul = refuse_once
    a2, b2 = rand((M, K), "float32"), rand((K, N), "float32")
    d = matmul(a2, b2)
    assert plan.algorithm is not first  # the next algorithm ran
    assert rel_error(host(d), host(a2) @ host(b2)) < 1e-5


def test_search_beyond_heuristics_and_remembers(tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    a, b, bias = rand((1024, 512), "float16"), rand((512, 768), "float16"), rand((1024,), "float16")
    with Matmul(a, b) as mm:
        heuristic = mm.plan(epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
        timings = mm.autotune(iterations=1, search=True)
        assert len(timings) > len(heuristic)
        d, aux = mm.execute()
        assert rel_error(host(d), np.maximum(host(a) @ host(b) + host(bias)[:, None], 0)) < 5e-3
        best = timings[0][0].algorithm.config()
    assert (tmp_path / "tuning.json").exists()
    with Matmul(a, b) as again:
        again.plan(epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
        assert again.algorithm.algorithm.config() == best  # recalled, not searched again


def test_out_misuse_is_refused_before_the_call():
    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    mm = Matmul(a, b)
    mm.plan()
    wrong = {
        "shape": torch.empty(M, N + 1, device="cuda"),
        "dtype": torch.empty(M, N, device="cuda", dtype=torch.float16),
        "layout": torch.empty(N, M, device="cuda").t(),  # column-major: D is row-major, as A is
    }
    for what, out in wrong.items():
        with pytest.raises(nvblaslt.NvblasltError, match="out"):
            mm.execute(out=out)
    base = torch.empty(K * M + M * N, device="cuda")  # out overlapping A's memory
    a_view = base[: K * M].view(K, M).t()
    a_view.copy_(a)
    with Matmul(a_view, b) as overlapping:
        overlapping.plan()
        with pytest.raises(nvblaslt.NvblasltValueError, match="overlaps a"):
            overlapping.execute(out=base[K * M - M: K * M - M + M * N].view(N, M).t())
    jax = pytest.importorskip("jax")
    with pytest.raises(nvblaslt.NvblasltError, match="out"):
        mm.execute(out=jax.numpy.zeros((M, N), dtype=jax.numpy.float32))
    mm.free()


def test_reset_operands_rechecks_alignment_shape_and_device():
    a, b = rand((M, K), "float16"), rand((K, N), "float16")
    with Matmul(a, b) as mm:
        mm.plan()
        storage = torch.empty(M * K + 1, device="cuda", dtype=torch.float16)
        misaligned = storage[1:].view(M, K)  # 2-byte aligned, the plan assumed 256
        with pytest.raises(nvblaslt.NvblasltValueError, match="aligned to 2 bytes"):
            mm.reset_operands(a=misaligned)
        with pytest.raises(nvblaslt.NvblasltValueError, match="extents"):
            mm.reset_operands(a=rand((M + 1, K), "float16"))
        with pytest.raises(nvblaslt.NvblasltTypeError, match="GPU memory"):
            mm.reset_operands(a=a.cpu())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_operands_on_two_gpus():
    a0 = rand((M, K), "float32")
    b1 = rand((K, N), "float32").to("cuda:1")
    with pytest.raises(nvblaslt.NvblasltValueError, match="b: on GPU 1, but a is on GPU 0"):
        matmul(a0, b1)
    a1 = a0.to("cuda:1")
    with torch.cuda.device(1):
        d = matmul(a1, b1, epilog="RELU")  # a plan, handle and result on GPU 1
    assert d.device == torch.device("cuda", 1)
    assert rel_error(host(d), np.maximum(host(a1) @ host(b1), 0)) < 1e-5
    with Matmul(a1, b1) as mm:
        mm.plan()
        with pytest.raises(nvblaslt.NvblasltValueError, match="device"):
            mm.reset_operands(b=rand((K, N), "float32"))  # on GPU 0
        bias0 = rand((M,), "float32")
    with Matmul(a1, b1) as mm:
        with pytest.raises(nvblaslt.NvblasltValueError, match="GPU 0, but the operands are on GPU 1"):
            mm.plan(epilog="BIAS", epilog_inputs={"bias": bias0})


def test_function_form_follows_the_framework_current_stream():
    """A cached plan made on one stream must run on whatever stream is current at the call."""
    a, b = rand((M, K), "float32"), rand((K, N), "float32")
    matmul(a, b)  # plans (and caches) on the default stream
    fresh = rand((M, K), "float32")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # keep `stream` busy; the copy below waits behind it
        a.copy_(fresh)
        d = matmul(a, b)  # must run on `stream`, after the copy; on another stream it reads old a
    stream.synchronize()
    assert rel_error(host(d), host(fresh) @ host(b)) < 1e-5


def test_drelu_plus_row_sum_gemv_gives_drelu_bgrad_outputs():
    """The bench's two-call alternative computes the same D and bias gradient as DRELU_BGRAD."""
    x, w, bias = rand((M, K), "float32"), rand((K, N), "float32"), rand((M,), "float32")
    _, aux = matmul(x, w, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
    g1, g2 = rand((M, K), "float32"), rand((K, N), "float32")
    fused, outputs = matmul(g1, g2, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})
    masked = matmul(g1, g2, epilog="DRELU", epilog_inputs={"relu_aux": aux["relu_aux"]})
    sums = matmul(masked, torch.ones(N, 1, device="cuda"))
    assert torch.equal(masked, fused)
    assert rel_error(host(sums[:, 0]), host(outputs["drelu_bgrad"])) < 1e-5


@pytest.mark.parametrize("epilog", ["DRELU_BGRAD", "DGELU_BGRAD"])
def test_autotune_search_picks_fused_or_split_bias_gradient_and_both_are_right(epilog):
    activation = epilog[1:].split("_")[0]
    key = "relu_aux" if activation == "RELU" else "gelu_aux"
    x, w, bias = rand((2, 512, 256), "float16"), rand((256, 384), "float16"), rand((2, 512), "float16")
    _, aux = matmul(x, w, epilog=f"{activation}_AUX_BIAS", epilog_inputs={"bias": bias})
    g1, g2 = rand((2, 512, 128), "float16"), rand((128, 384), "float16")
    reference, ref_outputs = matmul(g1, g2, epilog=epilog, epilog_inputs={key: aux[key]})
    with Matmul(g1, g2) as mm:
        mm.plan(epilog=epilog, epilog_inputs={key: aux[key]})
        mm.autotune(iterations=2, search=True, remember=False)
        assert mm.bias_gradient_form[0] in ("fused", "split")
        d, outputs = mm.execute()
        split = mm._make_split_form(1)  # the two-call form, whatever autotune chose
        d2, outputs2 = split.run(mm.stream, mm.stream, None)
        torch.cuda.synchronize()
        for got_d, got in ((d, outputs), (d2, outputs2)):
            assert rel_error(host(got_d), host(reference)) < 5e-3
            assert got[f"d{activation.lower()}_bgrad"].shape == (2, 512, 1)
            assert rel_error(host(got[f"d{activation.lower()}_bgrad"]),
                             host(ref_outputs[f"d{activation.lower()}_bgrad"])) < 2e-2
        split.free()


def test_bias_gradient_reaches_a_protocol_only_caller():
    cupy = pytest.importorskip("cupy")

    class Protocol:
        def __init__(self, array):
            self.__cuda_array_interface__ = array.__cuda_array_interface__
            self._keep = array

    a = cupy.asarray(RNG.standard_normal((M, K)), dtype=cupy.float32)
    b = cupy.asarray(RNG.standard_normal((K, N)), dtype=cupy.float32)
    d, aux = matmul(Protocol(a), Protocol(b), epilog="BGRADB")
    assert isinstance(aux["bgradb"], nvblaslt.DeviceArray) and aux["bgradb"].shape == (N,)
    assert rel_error(cupy.asarray(aux["bgradb"]).get(), b.get().sum(axis=0)) < 1e-5


def test_the_bias_gradient_form_is_remembered_with_the_algorithm(tmp_path, monkeypatch):
    monkeypatch.setenv("NVBLASLT_CACHE_DIR", str(tmp_path))
    x, w, bias = rand((1024, 256), "float16"), rand((256, 2048), "float16"), rand((1024,), "float16")
    _, aux = matmul(x, w, epilog="RELU_AUX_BIAS", epilog_inputs={"bias": bias})
    g1, g2 = rand((1024, 512), "float16"), rand((512, 2048), "float16")
    reference, ref_outputs = matmul(g1, g2, epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})
    with Matmul(g1, g2) as tuned:
        tuned.plan(epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})
        tuned.autotune(iterations=2, search=True)
        form = tuned.bias_gradient_form[0]
    with Matmul(g1, g2) as again:  # no autotune: the remembered choice comes back at plan time
        again.plan(epilog="DRELU_BGRAD", epilog_inputs={"relu_aux": aux["relu_aux"]})
        assert (again._split_form is not None) == (form == "split")
        d, outputs = again.execute()
        assert rel_error(host(d), host(reference)) < 5e-3
        assert rel_error(host(outputs["drelu_bgrad"]), host(ref_outputs["drelu_bgrad"])) < 2e-2
