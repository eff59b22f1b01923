"""Find algorithms the heuristics do not offer, most promising first: the incumbent's own kernel with
its other custom options and split-K counts, the heuristics' ranking beyond the launch's list, the picks
they make for the same problem under other epilogs, cluster-shape and swizzle variants of those, the
heuristic picks' custom options and split-K counts, then every algorithm id and tile. Each is kept only
if ``cublasLtMatmulAlgoCheck`` accepts it for the launch. Everything is read from the launch's C
descriptors. ``_autotune`` screens them within its time budget, so the order matters: the
enumeration of every id and tile (thousands of checks) runs only if the budget reaches it.

Why custom options and split-K: on an H200 (cuBLASLt 13.1) the pool without them held 29–115
candidates for Llama-3-8B's layers, screened in 0.2–1.0 s of a 9.5 s budget, while the heuristics' own
picks differ from each other mostly in those two settings (nvjet's ``CUSTOM_OPTION`` 1, 3, 7 and split
counts 6, 3, 2 on one layer as M grows).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Iterator

from . import _tuning_cache
from ._descriptors import Algorithm, HeuristicResult, MatmulDesc, MatmulPreference, heuristics
from ._errors import CublasLtError, NvblasltError
from ._epilogs import BIAS_EPILOGS, SEARCH_OTHER_EPILOGS

DEEPER_HEURISTICS = 64  # how far down the heuristics' own ranking to look
SPLITS = (1, 2, 3, 4, 6, 8)  # split-K counts tried on a kernel that supports split-K
MAX_CUSTOM_OPTIONS = 16  # custom options tried per kernel at most (its CUSTOM_OPTION_MAX + 1 where fewer)
_REDUCTION_SCHEMES = (1, 2, 4)  # INPLACE, COMPUTE_TYPE, OUTPUT_TYPE: those the launch's preference allows


def _types(launch) -> tuple[int, ...]:
    """(compute type, scale type, A, B, C, D types) as cublasLtMatmulAlgoGetIds/Init take them."""
    return (launch.desc.get("COMPUTE_TYPE"), launch.desc.get("SCALE_TYPE"),
            *(layout.get("TYPE") for layout in launch.layouts))


def _configured(launch, base, settings: dict, workspace_limit: int) -> HeuristicResult | None:
    """A copy of ``base`` with config ``settings``, if the library accepts it for this launch."""
    lib = launch.lib
    algo = lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(base)
    candidate = Algorithm(algo, lib)
    try:
        for attribute, value in settings.items():
            candidate.set(attribute, value)
    except CublasLtError:
        return None
    result = launch.check(algo)
    return result if result is not None and result.workspace_size <= workspace_limit else None


def _rechecked(launch, results: Iterable[HeuristicResult], workspace_limit: int) -> list[HeuristicResult]:
    found = []
    for other in results:
        result = launch.check(launch.lib.api.cublasLtMatmulAlgo_t.from_buffer_copy(other.algorithm.algo))
        if result is not None and result.workspace_size <= workspace_limit:
            found.append(result)
    return found


def _deeper_heuristics(launch) -> list[HeuristicResult]:
    """The heuristics' own ranking for this launch, past the launch's ``limit``."""
    a, b, c, d = launch.layouts
    try:
        return heuristics(launch.handle, launch.desc, a, b, c, d, launch.preference, count=DEEPER_HEURISTICS)
    except CublasLtError:
        return []


def _desc_with_epilog(launch, epilog: int) -> MatmulDesc:
    """A copy of the launch's MatmulDesc (types, transposes, scale pointers…) with another epilogue."""
    lib, source = launch.lib, launch.desc
    desc = MatmulDesc(source.get("COMPUTE_TYPE"), source.get("SCALE_TYPE"), lib=lib)
    for member in lib.api.ATTRIBUTES[lib.api.cublasLtMatmulDescAttributes_t][2]:
        if member.name.startswith(("EPILOGUE", "BIAS_")) or member.name in ("COMPUTE_TYPE", "SCALE_TYPE"):
            continue
        try:
            value = source.get(member)
            if value != desc.get(member):
                desc.set(member, value)
        except NvblasltError:  # absent from the loaded library, or read-only
            continue
    desc.set("EPILOGUE", int(epilog))
    if epilog in BIAS_EPILOGS:  # the heuristics want a pointer; nothing runs
        desc.set("BIAS_POINTER", launch.workspace.pointer if launch.workspace else 256)
    return desc


def _heuristics_of_other_epilogs(launch, workspace_limit: int) -> list[HeuristicResult]:
    """The heuristics' picks for the same problem under other epilogs, re-checked against this
    launch: tiles the heuristics never pair with an aux epilogue, such as Hopper's 192x192, are
    reached only this way (they are not in the capability lists)."""
    lib = launch.lib
    a, b, c, d = launch.layouts
    found: list[HeuristicResult] = []
    with MatmulPreference(max_workspace_bytes=workspace_limit, lib=lib) as preference:
        for member in (*(f"MIN_ALIGNMENT_{name}_BYTES" for name in "ABCD"), "REDUCTION_SCHEME_MASK", "IMPL_MASK",
                       "MAX_WAVES_COUNT"):
            try:
                preference.set(member, launch.preference.get(member))
            except NvblasltError:  # a library without it
                continue
        for epilog in SEARCH_OTHER_EPILOGS:
            if epilog == int(launch.desc.get("EPILOGUE")):
                continue
            try:
                with _desc_with_epilog(launch, epilog) as desc:
                    others = heuristics(launch.handle, desc, a, b, c, d, preference, count=16)
            except CublasLtError:
                continue
            found += _rechecked(launch, others, workspace_limit)
    return found


def _variants(launch, base: HeuristicResult, workspace_limit: int) -> Iterator[HeuristicResult]:
    """``base`` with other cluster shapes and CTA swizzling, where accepted."""
    lib = launch.lib
    cluster_shapes = [m.value for m in getattr(lib.api, "cublasLtClusterShape_t", [])
                      if m.name in ("SHAPE_AUTO", "SHAPE_1x1x1", "SHAPE_2x1x1", "SHAPE_1x2x1", "SHAPE_2x2x1",
                                    "SHAPE_4x1x1", "SHAPE_1x4x1")]
    algorithm = base.algorithm
    swizzles = [0, 1] if algorithm.capability("CTA_SWIZZLING_SUPPORT") else [0]
    for cluster in cluster_shapes or [None]:
        for swizzle in swizzles:
            settings = {"CTA_SWIZZLING": swizzle}
            if cluster is not None:
                settings["CLUSTER_SHAPE_ID"] = cluster
            checked = _configured(launch, algorithm.algo, settings, workspace_limit)
            if checked is not None:
                yield checked


def _option_variants(launch, base: HeuristicResult, workspace_limit: int) -> Iterator[HeuristicResult]:
    """``base`` with each other custom option and split-K count (with each reduction scheme the launch's
    preference allows), where accepted."""
    algorithm = base.algorithm
    try:
        options = range(min(int(algorithm.capability("CUSTOM_OPTION_MAX")) + 1, MAX_CUSTOM_OPTIONS))
        splits = SPLITS if algorithm.capability("SPLITK_SUPPORT") else (1,)
        supported = int(algorithm.capability("REDUCTION_SCHEME_MASK"))
        allowed = int(launch.preference.get("REDUCTION_SCHEME_MASK"))
    except NvblasltError:  # a library without these capabilities: nothing to vary
        return
    schemes = [scheme for scheme in _REDUCTION_SCHEMES if scheme & supported & allowed]
    for option in options:
        for count in splits:
            for scheme in ([0] if count == 1 else schemes):
                settings = {"CUSTOM_OPTION": option, "SPLITK_NUM": count, "REDUCTION_SCHEME": scheme}
                checked = _configured(launch, algorithm.algo, settings, workspace_limit)
                if checked is not None:
                    yield checked


def _enumerated(launch, workspace_limit: int) -> Iterator[HeuristicResult]:
    """Every (algorithm id, tile) from the capability lists that the library accepts for this launch,
    with the stage count left to the library where it allows that."""
    lib = launch.lib
    handle = launch.handle.handle
    types = _types(launch)
    ids = (ctypes.c_int * 256)()
    count = ctypes.c_int()
    lib.cublasLtMatmulAlgoGetIds(handle, *types, 256, ids, ctypes.byref(count))
    epilog = int(launch.desc.get("EPILOGUE"))
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
                result = _configured(launch, base, {"TILE_ID": tile, "STAGES_ID": stage}, workspace_limit)
                if result is not None:
                    yield result
                    break


def candidates(launch, *, workspace_limit: int, incumbent: HeuristicResult | None = None) -> Iterator[HeuristicResult]:
    """Configurations beyond the launch's heuristic list, without duplicates, most promising first:
    the incumbent's custom options and split-K counts, the heuristics' deeper ranking, other epilogs'
    picks, cluster-shape and swizzle variants (of the incumbent first, then of the heuristic picks), the
    heuristic picks' custom options and split-K counts, then every enumerated id and tile. Lazy: stop
    iterating and the remaining checks are never made."""
    seen = {config_key(r) for r in launch.algorithms}
    preference = launch.preference

    def fresh(results: Iterable[HeuristicResult]) -> Iterator[HeuristicResult]:
        for result in results:
            key = config_key(result)
            if key not in seen:
                seen.add(key)
                if _tuning_cache.fits_preference(result, preference):  # the check does not read it
                    yield result

    if incumbent is not None:  # its nearest neighbours: the same kernel, another option or split count
        yield from fresh(_option_variants(launch, incumbent, workspace_limit))
    deeper = _rechecked(launch, _deeper_heuristics(launch), workspace_limit)
    yield from fresh(deeper)
    others = _heuristics_of_other_epilogs(launch, workspace_limit)
    yield from fresh(others)
    bases = [*([incumbent] if incumbent is not None else []), *launch.algorithms, *others, *deeper]
    for base in bases:
        yield from fresh(_variants(launch, base, workspace_limit))
    for base in launch.algorithms:
        yield from fresh(_option_variants(launch, base, workspace_limit))
    yield from fresh(_enumerated(launch, workspace_limit))


def config_key(result: HeuristicResult) -> tuple:
    return tuple(sorted(result.algorithm.config().items()))
