"""Find algorithms the heuristics do not offer: enumerate algorithm ids, their tiles and stages,
keep the configurations ``cublasLtMatmulAlgoCheck`` accepts for the plan, and let autotune
time them. What autotune picks is remembered on disk, so a problem is searched once.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
from pathlib import Path

from . import _cuda
from ._descriptors import Algorithm, HeuristicResult
from ._errors import CublasLtError


def _types(plan):
    api, problem = plan._lib.api, plan.problem
    return (getattr(api, problem.compute_type_name), getattr(api, problem.scale_type_name),
            getattr(api, problem.a.dtype.cuda), getattr(api, problem.b.dtype.cuda),
            getattr(api, problem.c.dtype.cuda), getattr(api, problem.d.dtype.cuda))


def _check(plan, algo) -> HeuristicResult | None:
    lib = plan._lib
    result = lib.api.cublasLtMatmulHeuristicResult_t()
    layouts = plan._layouts
    try:
        lib.cublasLtMatmulAlgoCheck(plan._handle.handle, plan._desc.handle, layouts[0].handle, layouts[1].handle,
                                    layouts[2].handle, layouts[3].handle, ctypes.byref(algo), ctypes.byref(result))
    except CublasLtError:
        return None
    return HeuristicResult(result, lib)


def _enumerated(plan, workspace_limit: int) -> list[HeuristicResult]:
    """Every (algorithm id, tile) from the capability lists that the library accepts for this plan,
    with the stage count left to the library where it allows that."""
    lib = plan._lib
    handle = plan._handle.handle
    types = _types(plan)
    ids = (ctypes.c_int * 256)()
    count = ctypes.c_int()
    lib.cublasLtMatmulAlgoGetIds(handle, *types, 256, ids, ctypes.byref(count))
    epilog = int(plan.epilog)
    found = []
    for algo_id in ids[:count.value]:
        base = lib.api.cublasLtMatmulAlgo_t()
        try:
            lib.cublasLtMatmulAlgoInit(handle, *types, algo_id, ctypes.byref(base))
        except CublasLtError:
            continue
        algorithm = Algorithm(base, lib)
        if epilog != 1 and not algorithm.capability("EPILOGUE_MASK") & epilog:
            continue
        tiles = algorithm.capability("TILE_IDS") or [0]
        stages = [0] + [s for s in (algorithm.capability("STAGES_IDS") or []) if s]
        for tile in tiles:
            for stage in stages:  # 0 (undefined) first: the library picks; else the first one accepted
                result = _configured(plan, base, {"TILE_ID": tile, "STAGES_ID": stage}, workspace_limit)
                if result is not None:
                    found.append(result)
                    break
    return found


def _configured(plan, base, settings: dict, workspace_limit: int) -> HeuristicResult | None:
    """A copy of ``base`` with config ``settings``, if the library accepts it for this plan."""
    lib = plan._lib
    algo = lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(base)
    candidate = Algorithm(algo, lib)
    try:
        for attribute, value in settings.items():
            candidate.set(attribute, value)
    except CublasLtError:
        return None
    result = _check(plan, algo)
    return result if result is not None and result.workspace_size <= workspace_limit else None


def _heuristics_of_other_epilogs(plan, workspace_limit: int, epilogs=(1, 6, 4)) -> list[HeuristicResult]:
    """The heuristics' picks for the same problem under other epilogs (DEFAULT, RELU_BIAS, BIAS),
    re-checked against this plan: tiles the heuristics never pair with an aux epilogue, such as
    Hopper's 192x192, are reached only this way (they are not in the capability lists)."""
    from ._descriptors import MatmulDesc, MatmulPreference, heuristics

    lib, api = plan._lib, plan._lib.api
    found = []
    with MatmulPreference(max_workspace_bytes=workspace_limit, lib=lib) as preference:
        for name in ("A", "B", "C", "D"):
            member = f"MIN_ALIGNMENT_{name}_BYTES"
            preference.set(member, plan._preference.get(member))
        for epilog in epilogs:
            if epilog == int(plan.epilog):
                continue
            with MatmulDesc(getattr(api, plan.problem.compute_type_name),
                            getattr(api, plan.problem.scale_type_name), lib=lib) as desc:
                desc.set("TRANSA", plan.problem.a.trans)
                desc.set("TRANSB", plan.problem.b.trans)
                desc.set("EPILOGUE", epilog)
                if epilog in (4, 6):
                    desc.set("BIAS_POINTER", plan._workspace.pointer if plan._workspace else 256)
                try:
                    others = heuristics(plan._handle, desc, *plan._layouts, preference, count=16)
                except CublasLtError:
                    continue
            for other in others:
                result = _check(plan, lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(other.algorithm.algo))
                if result is not None and result.workspace_size <= workspace_limit:
                    found.append(result)
    return found


def _variants(plan, results, workspace_limit: int) -> list[HeuristicResult]:
    """Each configuration with other cluster shapes and CTA swizzling, where accepted."""
    lib = plan._lib
    cluster_shapes = [m.value for m in getattr(lib.api, "cublasLtClusterShape_t", [])
                      if m.name in ("SHAPE_AUTO", "SHAPE_1x1x1", "SHAPE_2x1x1", "SHAPE_1x2x1", "SHAPE_2x2x1",
                                    "SHAPE_4x1x1", "SHAPE_1x4x1")]
    found = []
    for result in results:
        base = result.algorithm
        swizzles = [0, 1] if base.capability("CTA_SWIZZLING_SUPPORT") else [0]
        for cluster in cluster_shapes or [None]:
            for swizzle in swizzles:
                settings = {"CTA_SWIZZLING": swizzle}
                if cluster is not None:
                    settings["CLUSTER_SHAPE_ID"] = cluster
                checked = _configured(plan, base.algo, settings, workspace_limit)
                if checked is not None:
                    found.append(checked)
    return found


def configurations(plan, *, workspace_limit: int) -> list[HeuristicResult]:
    """Candidates beyond the plan's heuristic list, each accepted by cublasLtMatmulAlgoCheck,
    without duplicates: enumerated ids and tiles, other epilogs' heuristic picks, and cluster-shape
    and swizzle variants of those and of the plan's own heuristic picks."""
    seeds = _heuristics_of_other_epilogs(plan, workspace_limit)
    found = [*_enumerated(plan, workspace_limit), *seeds,
             *_variants(plan, [*plan.algorithms, *seeds], workspace_limit)]
    unique, seen = [], {config_key(r) for r in plan.algorithms}
    for result in found:
        key = config_key(result)
        if key not in seen:
            seen.add(key)
            unique.append(result)
    return unique


def config_key(result: HeuristicResult) -> tuple:
    return tuple(sorted(result.algorithm.config().items()))


# ---- the tuning cache ---------------------------------------------------------------------------
_lock = threading.Lock()


def cache_path() -> Path:
    root = os.environ.get("NVBLASLT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nvblaslt")
    return Path(root) / "tuning.json"


def problem_key(plan) -> str:
    """What the choice depends on: GPU, library version, shapes, layouts, types, epilog, alignment."""
    problem, lib = plan.problem, plan._lib
    props = _cuda.device_properties(plan._device)
    parts = [props.name.decode(), lib.version, problem.batch_count, problem.m, problem.n, problem.k,
             problem.compute_type_name, problem.scale_type_name, plan.epilog.name,
             *[(s.trans, s.rows, s.cols, s.ld, s.batch_stride, s.dtype.name) for s in
               (problem.a, problem.b, problem.c, problem.d)],
             *[op.alignment if op is not None else 256 for op in plan._operands.values()]]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _load() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def remember(plan, result: HeuristicResult, milliseconds: float, **extra) -> None:
    """Store the chosen algorithm (its 64 bytes, valid for this library version) for the problem,
    with ``extra`` facts about the choice (such as the bias-gradient form)."""
    with _lock:
        entries = _load()
        entry = entries.get(problem_key(plan), {})
        entry.update({"algo": bytes(result.algorithm.algo).hex(), "ms": milliseconds,
                      "config": dict(result.algorithm.config()), **extra})
        entries[problem_key(plan)] = entry
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.replace(path)


def recall(plan) -> tuple[HeuristicResult | None, dict]:
    """(the remembered algorithm, if the library still accepts it; the stored entry) for this plan."""
    entries = _load()
    entry = entries.get(problem_key(plan)) if entries else None
    if entry is None:
        return None, {}
    algo = plan._lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(bytes.fromhex(entry["algo"]))
    return _check(plan, algo), entry
