"""What ``import nvblaslt`` loads, and what it leaves for the first call (issue 23, cold start).

Each check runs in a fresh interpreter: this test process has long since imported everything."""

import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_loads_neither_the_cuda_runtime_bindings_nor_the_library():
    out = _run("""
        import sys
        import nvblaslt
        heavy = [name for name in ("cuda.bindings.runtime", "cuda.bindings.driver", "numpy", "torch", "cupy")
                 if name in sys.modules]
        libs = [line.split()[-1] for line in open("/proc/self/maps") if "libcublasLt" in line]
        print(heavy, libs)
    """)
    assert out.strip() == "[] []"


# What a plain matmul never needs: grouped GEMM, autotune and its search and timing (with statistics), the
# tuning cache's writer (tempfile, with shutil, bz2 and lzma), and logging until someone else imports it
LEFT_FOR_FIRST_USE = ["nvblaslt._grouped", "nvblaslt._grouped_function", "nvblaslt._grouped_problem",
                      "nvblaslt._grouped_arrays", "nvblaslt._grouped_tuning", "nvblaslt._jit", "nvblaslt._autotune",
                      "nvblaslt._search", "nvblaslt._timing", "statistics", "tempfile", "logging"]


def test_import_leaves_what_a_plain_matmul_never_needs():
    out = _run(f"""
        import sys
        before = set(sys.modules)  # what the interpreter's start loaded is not nvblaslt's
        import nvblaslt
        print([name for name in {LEFT_FOR_FIRST_USE!r} if name in sys.modules and name not in before])
    """)
    assert out.strip() == "[]"


def test_the_names_left_for_first_use_answer_every_way_of_asking():
    out = _run("""
        import sys
        import nvblaslt
        listed = [name in dir(nvblaslt) for name in ("GroupedMatmul", "grouped_matmul", "clear_grouped_plans")]
        from nvblaslt import GroupedMatmul, grouped_matmul
        from nvblaslt import _grouped, _grouped_function
        same = [GroupedMatmul is _grouped.GroupedMatmul, grouped_matmul is _grouped_function.grouped_matmul,
                nvblaslt.clear_grouped_plans is _grouped_function.clear_grouped_plans]
        try:
            nvblaslt.no_such_name
        except AttributeError as error:
            missing = str(error)
        print(listed, same, missing)
    """)
    assert out.strip() == "[True, True, True] [True, True, True] module 'nvblaslt' has no attribute 'no_such_name'"


def test_the_first_runtime_call_rebinds_every_module_to_the_real_runtime():
    # after one call, no nvblaslt module reaches the runtime through the lazy object: calls pay nothing
    out = _run("""
        import sys
        import nvblaslt
        from nvblaslt import _cuda
        lazy = _cuda.cudart
        _cuda.device_count()  # 0 without a GPU, and it needs the runtime either way
        from cuda.bindings import runtime
        modules = {name: module for name, module in sys.modules.items()
                   if name.startswith("nvblaslt") and hasattr(module, "cudart")}
        still_lazy = sorted(name for name, module in modules.items() if module.cudart is lazy)
        real = sorted(name for name, module in modules.items() if module.cudart is runtime)
        # modules `import nvblaslt` leaves for their first use take the real runtime when they come
        from nvblaslt import _grouped_arrays, _timing
        late = [module.cudart is runtime for module in (_grouped_arrays, _timing)]
        print(still_lazy, len(real) >= 7, "nvblaslt._host" in real, late)
    """)
    assert out.strip() == "[] True True [True, True]"


@pytest.mark.parametrize("name", ["cudaGetDeviceCount", "cudaError_t"])
def test_the_lazy_runtime_answers_like_the_module(name):
    from cuda.bindings import runtime

    from nvblaslt._cuda import _LazyRuntime

    assert getattr(_LazyRuntime(), name) is getattr(runtime, name)


def test_the_first_runtime_call_loads_no_library_through_a_module_getattr():
    # nvblaslt.lt answers unknown attributes by loading libcublasLt: the rebinding must not ask it
    out = _run("""
        import sys
        import nvblaslt, nvblaslt.lt
        from nvblaslt import _cuda, _loader
        def refuse(*args, **kwargs):
            raise AssertionError("the library was loaded")
        _loader.load = refuse
        _cuda.device_count()
        print("ok", "libcublasLt" in open("/proc/self/maps").read())
    """)
    assert out.strip() == "ok False"


def test_a_blocked_module_entry_and_a_kept_proxy_are_fine():
    out = _run("""
        import sys
        import nvblaslt
        from nvblaslt import _cuda
        kept = _cuda.cudart                       # the proxy, held by someone before the first call
        sys.modules["nvblaslt.blocked"] = None    # monkeypatch.setitem(sys.modules, ..., None), as tests do
        _cuda.device_count()
        from cuda.bindings import runtime
        print(kept.cudaGetDeviceCount is runtime.cudaGetDeviceCount, _cuda.cudart is runtime)
    """)
    assert out.strip() == "True True"


def test_the_first_runtime_call_imports_no_lazy_module_of_another_package():
    # a lazy module (importlib.util.LazyLoader, as CuPy's cupyx.scipy uses) imports in full on its first
    # attribute read: looking for nvblaslt's modules must not read one (cupyx.scipy's cost 0.4 s on an H200)
    out = _run("""
        import importlib.abc, importlib.machinery, importlib.util, sys
        loaded = []
        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return None
            def exec_module(self, module):
                loaded.append(module.__name__)
        spec = importlib.machinery.ModuleSpec("lazy_elsewhere", importlib.util.LazyLoader(Loader()))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["lazy_elsewhere"] = module
        import nvblaslt
        from nvblaslt import _cuda
        _cuda.device_count()
        print(loaded)
        module.__name__  # the stand-in works: its first attribute read loads it
        print(loaded)
    """)
    assert out.split() == ["[]", "['lazy_elsewhere']"]


def test_nvblaslt_records_reach_logging_from_their_call_site_once_it_is_imported():
    # nvblaslt does not import logging for its own records: none could be shown before it is imported
    out = _run("""
        import sys
        from nvblaslt import _tuning_cache
        earlier_format = b'{"key": {"algo": "00"}}'  # parse() logs it at debug level
        _tuning_cache.parse(earlier_format)
        imported = "logging" in sys.modules
        import logging
        logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s %(funcName)s: %(message)s")
        _tuning_cache.parse(earlier_format)
        print(imported)
    """)
    assert out.splitlines() == ["nvblaslt parse: tuning cache: an earlier nvblaslt's format; its entries are not reused",
                                "False"]
