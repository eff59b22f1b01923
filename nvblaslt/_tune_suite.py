"""The built-in LLM suite of ``nvblaslt tune``: the GEMMs of Llama-3-8B/70B, Mixtral-8x7B and Qwen3
(8B dense, 30B-A3B mixture of experts) layers at 1 to 8192 tokens, as problems in the form
``NVBLASLT_RECORD`` writes (``_tuning_record``), each with a ``name`` for people.

Per dense layer (x (T, in) row-major, W (out, in) row-major, as ``nn.Linear`` and ``nvblaslt.torch``
keep them):

- forward ``y = x Wᵀ``, bf16, and fp8 (E4M3 operands, bf16 result; T a multiple of 16);
- with an epilog, the MLP's up projection as ``FusedLinear(activation="gelu")`` runs it: forward
  ``W xᵀ`` with GELU_AUX_BIAS, and at training sizes its backward: DGELU (the input gradient, with
  the forward's aux) and BGRADB (the weight gradient, with the bias gradient; K is the tokens).

Mixture-of-experts layers add grouped GEMMs (``grouped_matmul``: tokens (ΣM, K) routed evenly over
the experts, weights (G, N, K) as ``nn.Linear`` stores them), tuned where cuBLASLt has grouped GEMM.

``invariant_suite`` is ``nvblaslt tune --batch-invariant``'s: every (N, K) pair of the dense layers with
BIAS / RELU_BIAS / GELU_BIAS as ``nvblaslt.torch`` runs a layer with a bias and ``batch_invariant=True``
(``W @ xᵀ``, the tokens D's columns), bf16; other epilogs run as ``x @ Wᵀ`` (the tokens D's rows).
"""

from __future__ import annotations

from dataclasses import dataclass

TOKENS = (1, 16, 128, 1024, 8192)
INVARIANT_EPILOGS = ("BIAS", "RELU_BIAS", "GELU_BIAS")
INVARIANT_TOKENS = 1024  # any count: a pin is keyed with the tokens left out
TRAINING_TOKENS = (1024, 8192)  # backward passes: training batches
DTYPES = ("bf16", "fp8")
FP8_MULTIPLE = 16


@dataclass(frozen=True)
class Model:
    hidden: int
    q: int  # query projection width (heads × head dim)
    kv: int  # one of key / value (kv heads × head dim)
    intermediate: int  # of the dense MLP, or of one expert
    experts: int = 0  # 0: dense
    top_k: int = 0


MODELS = {
    "llama3-8b": Model(4096, 4096, 1024, 14336),
    "llama3-70b": Model(8192, 8192, 1024, 28672),
    "mixtral-8x7b": Model(4096, 4096, 1024, 14336, experts=8, top_k=2),
    "qwen3-8b": Model(4096, 4096, 1024, 12288),
    "qwen3-30b-a3b": Model(2048, 4096, 512, 768, experts=128, top_k=8),
}


def _array(shape, strides, dtype: str) -> dict:
    return {"shape": list(shape), "strides": list(strides), "dtype": dtype}


def _row_major(rows: int, cols: int, dtype: str) -> dict:
    return _array((rows, cols), (cols, 1), dtype)


def _transposed(rows: int, cols: int, dtype: str) -> dict:
    """The (cols, rows) view ``.T`` of a row-major (rows, cols) array."""
    return _array((cols, rows), (1, cols), dtype)


def _options(result: str, **more) -> dict:
    return {"compute_type": "COMPUTE_32F", "scale_type": "CUDA_R_32F", "result_type": result, **more}


def linears(model: Model) -> dict[str, tuple[int, int]]:
    """{layer: (in features, out features)} of one transformer block's dense GEMMs."""
    found = {"qkv": (model.hidden, model.q + 2 * model.kv), "o": (model.q, model.hidden)}
    if not model.experts:
        found.update(gate_up=(model.hidden, 2 * model.intermediate), down=(model.intermediate, model.hidden))
    return found


def _dense(name: str, fan_in: int, fan_out: int, tokens: int, dtypes) -> list[dict]:
    problems = []
    if "bf16" in dtypes:
        problems.append({"kind": "matmul", "name": f"{name} forward bf16 T={tokens}",
                         "a": _row_major(tokens, fan_in, "bfloat16"), "b": _transposed(fan_out, fan_in, "bfloat16"),
                         "c": None, "epilog": "DEFAULT", "inputs": {}, "options": _options("bfloat16")})
    if "fp8" in dtypes and tokens % FP8_MULTIPLE == 0:
        problems.append({"kind": "matmul", "name": f"{name} forward fp8 T={tokens}",
                         "a": _row_major(tokens, fan_in, "float8_e4m3fn"),
                         "b": _transposed(fan_out, fan_in, "float8_e4m3fn"), "c": None, "epilog": "DEFAULT",
                         "inputs": {}, "options": _options("bfloat16")})
    return problems


def _with_epilogs(name: str, fan_in: int, fan_out: int, tokens: int) -> list[dict]:
    """The up projection as FusedLinear(activation="gelu") runs it (bf16): forward, and at training sizes
    the input and weight gradients."""
    bf16 = "bfloat16"
    problems = [{"kind": "matmul", "name": f"{name} GELU_AUX_BIAS forward bf16 T={tokens}",
                 "a": _row_major(fan_out, fan_in, bf16), "b": _transposed(tokens, fan_in, bf16), "c": None,
                 "epilog": "GELU_AUX_BIAS", "inputs": {"bias": _array((fan_out,), (1,), bf16)},
                 "options": _options(bf16)}]
    if tokens in TRAINING_TOKENS:
        # the next layer's input gradient dx = dz W_next (W_next (in, out) row-major: out → in) runs this
        # layer's GELU backward: D (out, T) column-major, with the forward's aux of D's shape
        problems.append({"kind": "matmul", "name": f"{name} DGELU input gradient of the next layer bf16 T={tokens}",
                         "a": _transposed(fan_in, fan_out, bf16), "b": _transposed(tokens, fan_in, bf16), "c": None,
                         "epilog": "DGELU", "inputs": {"gelu_aux": _array((fan_out, tokens), (1, fan_out), bf16)},
                         "options": _options(bf16)})
        problems.append({"kind": "matmul", "name": f"{name} BGRADB weight gradient bf16 T={tokens}",
                         "a": _transposed(tokens, fan_in, bf16), "b": _row_major(tokens, fan_out, bf16), "c": None,
                         "epilog": "BGRADB", "inputs": {}, "options": _options(bf16)})
    return problems


def _grouped(name: str, model: Model, fan_in: int, fan_out: int, tokens: int) -> dict:
    routed = tokens * model.top_k
    per_expert = -(-routed // model.experts)
    ends = [min(routed, per_expert * (g + 1)) for g in range(model.experts)]
    return {"kind": "grouped", "name": f"{name} grouped {model.experts} experts bf16 T={tokens}",
            "a": _row_major(routed, fan_in, "bfloat16"),
            "b": _array((model.experts, fan_in, fan_out), (fan_in * fan_out, 1, fan_in), "bfloat16"),
            "offs": ends}


def llm_suite(models=None, tokens=None, dtypes=None) -> list[dict]:
    """The suite's problems, for ``models`` (names of ``MODELS``), ``tokens`` and ``dtypes`` (default all)."""
    chosen = _models(models)
    token_counts = TOKENS if tokens is None else tuple(tokens)
    kinds = DTYPES if dtypes is None else tuple(dtypes)
    problems: list[dict] = []
    for model_name in chosen:
        model = MODELS[model_name]
        for count in token_counts:
            for layer, (fan_in, fan_out) in linears(model).items():
                problems += _dense(f"{model_name}.{layer}", fan_in, fan_out, count, kinds)
            if model.experts:
                if "bf16" in kinds:
                    problems.append(_grouped(f"{model_name}.experts.gate_up", model, model.hidden,
                                             2 * model.intermediate, count))
                    problems.append(_grouped(f"{model_name}.experts.down", model, model.intermediate, model.hidden,
                                             count))
            elif "bf16" in kinds:
                problems += _with_epilogs(f"{model_name}.mlp_up", model.hidden, model.intermediate, count)
    return problems


def dense_pairs(models=None) -> list[tuple[int, int]]:
    """Every (N, K) = (out features, in features) of ``models``' dense layers and MLP up projections."""
    pairs: set[tuple[int, int]] = set()
    for name in _models(models):
        model = MODELS[name]
        pairs.update((fan_out, fan_in) for fan_in, fan_out in linears(model).values())
        if not model.experts:
            pairs.add((model.intermediate, model.hidden))
    return sorted(pairs)


def invariant_suite(models=None, pairs=None, epilogs=None) -> list[dict]:
    """``batch_invariant`` problems: each (N, K) of ``pairs`` (default ``dense_pairs(models)``) with each
    epilog of ``epilogs`` (default ``INVARIANT_EPILOGS``), bf16."""
    from ._errors import NvblasltValueError

    chosen = dense_pairs(models) if pairs is None else [tuple(p) for p in pairs]
    bad = [p for p in chosen if len(p) != 2 or not all(isinstance(v, int) and v > 0 for v in p)]
    if bad:
        raise NvblasltValueError(f"pairs: expected (N, K) pairs of positive ints, got {bad}")
    kinds = INVARIANT_EPILOGS if epilogs is None else tuple(epilogs)
    known = ("DEFAULT", "RELU", "GELU", *INVARIANT_EPILOGS)
    unknown = [e for e in kinds if e not in known]
    if unknown:
        raise NvblasltValueError(f"epilogs: unknown {unknown}; batch-invariant problems take {list(known)}")
    bf16, tokens = "bfloat16", INVARIANT_TOKENS
    problems = []
    for n, k in chosen:
        for epilog in kinds:
            name = f"batch-invariant N={n} K={k} {epilog} bf16"
            if "BIAS" in epilog:  # W @ xᵀ: a bias per output feature, the tokens D's columns
                problems.append({"kind": "matmul", "name": name, "a": _row_major(n, k, bf16),
                                 "b": _transposed(tokens, k, bf16), "c": None, "epilog": epilog,
                                 "inputs": {"bias": _array((n,), (1,), bf16)},
                                 "options": _options(bf16, batch_invariant="columns")})
            else:  # x @ Wᵀ: the tokens D's rows
                problems.append({"kind": "matmul", "name": name, "a": _row_major(tokens, k, bf16),
                                 "b": _transposed(n, k, bf16), "c": None, "epilog": epilog, "inputs": {},
                                 "options": _options(bf16, batch_invariant="rows")})
    return problems


def _models(models) -> list[str]:
    chosen = list(MODELS) if models is None else list(models)
    unknown = [m for m in chosen if m not in MODELS]
    if unknown:
        from ._errors import NvblasltValueError

        raise NvblasltValueError(f"models: unknown {unknown}; known: {list(MODELS)}")
    return chosen
