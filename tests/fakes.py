"""Stand-in GPU arrays for CPU tests: they export real DLPack capsules or a CAI dict over fake
device pointers. nvblaslt must read (and refuse) them without touching the memory."""

from __future__ import annotations

import math

from nvblaslt import _cuda, _dlpack, _dtypes, _host, _scales


class Reached(Exception):
    """Raised in place of the first GPU step: every check before it passed."""


def reached(*args, **kwargs):
    raise Reached()


def forbid_gpu_work(monkeypatch, device_query=None) -> list:
    """Host staging, scale uploads and CUDA device questions fail the test (each recorded in the list
    returned); ``device_query`` instead replaces the device question, where a constructor's GPU work starts."""
    touched: list = []

    def forbidden(what):
        def record(*args, **kwargs):
            touched.append(what)
            raise AssertionError(f"{what} before the call was refused")
        return record
    monkeypatch.setattr(_host, "stage", forbidden("host staging"))
    monkeypatch.setattr(_scales.Scales, "write", forbidden("scale upload"))
    monkeypatch.setattr(_cuda, "several_devices", device_query or forbidden("a CUDA device query"))
    return touched


class FakeDLPack:
    def __init__(self, shape, strides=None, dtype="float32", ptr=0x7F0000000000, device=0, device_type=2,
                 versioned=True):
        self.shape = tuple(shape)
        if strides is None:
            strides, step = [], 1
            for n in reversed(self.shape):
                strides.insert(0, step)
                step *= max(n, 1)
        self.strides = tuple(strides)
        self.dtype = _dtypes.BY_NAME[dtype]
        self.ptr, self.device, self.device_type = ptr, device, device_type
        self.streams = []

    def __dlpack_device__(self):
        return self.device_type, self.device

    def __dlpack__(self, *, stream=None, max_version=None):
        self.streams.append(stream)
        return _dlpack.export(self.ptr, self.shape, self.strides, self.dtype.dlpack, self.device, self)

    @property
    def T(self):
        return FakeDLPack(self.shape[::-1], self.strides[::-1], self.dtype.name, self.ptr, self.device)


def fortran(shape, dtype="float32", ptr=0x7F0000000000):
    """A column-major matrix (or batch of them)."""
    rows, cols = shape[-2:]
    strides = (1, rows) if len(shape) == 2 else (rows * cols, 1, rows)
    return FakeDLPack(shape, strides, dtype, ptr)


class FakeCAI:
    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7F0000000000, mask=None, stream=None, readonly=False):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, readonly),
                                         "strides": strides, "version": 3, "mask": mask, "stream": stream}


class FakeGpuScalar:
    """A one-element array in GPU memory (DLPack device type 2), as a CUDA tensor reports itself."""

    shape = ()
    device = "cuda:0"

    def __init__(self, value: float = 2.0):
        self.value = value
        self.reads = 0  # copies back to the host (each waits for the GPU, for a real one)

    def item(self) -> float:
        self.reads += 1
        return self.value

    def __dlpack_device__(self):
        return 2, 0



def simulated_timer(milliseconds, generator, *, noise: float = 0.01, drift: float = 0.03, before=None):
    """A stand-in for the engine's CUDA-event ``Timer``: each timed run's ms is ``milliseconds()`` (what
    the run just did costs) with a slow drift and lognormal noise from ``generator``; ``before(calls)``
    runs ahead of each timing (to interrupt one, say)."""

    class Timer:
        calls = 0
        sample_s = 0.0  # the real Timer's wall seconds a sample: none here

        def __init__(self, device, stream):
            pass

        def __call__(self, run, prepare=None):
            if before is not None:
                before(Timer.calls)
            if prepare is not None:
                prepare()
            run()
            Timer.calls += 1
            return milliseconds() * (1 + drift * math.sin(Timer.calls / 30)) * math.exp(generator.gauss(0, noise))

        def synchronize(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass
    return Timer


class StandInLaunch:
    """What ``plan()`` asks of the launch it made once the checks passed: nothing reaches cuBLASLt
    (``Launch.planned`` patched to return it)."""

    algorithms: list = []
    algorithm = None

    def pointer_setter(self, attribute):
        return lambda pointer: None

    def bind(self, *pointers):
        pass

    def select(self, algorithm):
        pass

    def close(self):
        pass


class StandInEntry:
    """A JAX callback's plan entry, stood in: records the streams it ran on and whether a capture kept it
    or it was freed (``nvblaslt.jax``'s bridge and ``ragged_dot`` keep theirs alike). Each subclass holds
    the ``made`` list its test resets."""

    made: list = []

    def __init__(self, device, stream, generation=0):
        self.device, self.stream, self.runs = device, stream, []
        self.captured = self.freed = False
        self.generation = generation
        type(self).made.append(self)

    def keep(self):
        first, self.captured = not self.captured, True
        return first

    def free(self):
        self.freed = not self.captured


def on_grid(values: dict, grid) -> dict:
    """Values given at a few M, spread over every M of ``grid``: each M takes the value of the first given
    point at or above it (a kernel's time or speed as a step function of M)."""
    given = sorted(values)
    return {m: values[next((g for g in given if g >= m), given[-1])] for m in grid}
