"""The ``graph`` section: decode layers under CUDA-graph replay, where no host time is left. A graph of
8 layers (bf16; 1, 16, 256 tokens; 4096→4096 and 4096→14336; ReLU and tanh-GELU with bias) is captured
once with ``nvblaslt.torch.linear`` and once with ``nn.functional.linear`` + the activation; GPU time per
layer of each replay, CUDA events around bursts of replays, every case once per round."""

from __future__ import annotations

import statistics

from .common import captured, max_relative, progress
from .timing import event_rounds

GRAPH_LAYERS, GRAPH_REPLAYS = 8, 20
GRAPH_TOKENS = (1, 16, 256)
GRAPH_WIDTHS = ((4096, 4096), (4096, 14336))


def section(args, torch, results: dict) -> None:
    from torch.nn import functional

    from nvblaslt import torch as nvtorch

    rows = []
    generator = torch.Generator(device="cuda").manual_seed(3)
    configs = [(t, w, a) for w in GRAPH_WIDTHS for t in GRAPH_TOKENS for a in ("relu", "gelu")]
    with torch.no_grad():
        for index, (tokens, (d_in, d_out), activation) in enumerate(configs):
            progress(f"graph {index + 1}/{len(configs)}: {tokens} tokens, {d_in}->{d_out}, {activation}")
            x = torch.randn(tokens, d_in, device="cuda", dtype=torch.bfloat16, generator=generator)
            weights = [torch.randn(d_out, d_in, device="cuda", dtype=torch.bfloat16, generator=generator)
                       / d_in ** 0.5 for _ in range(GRAPH_LAYERS)]
            biases = [torch.randn(d_out, device="cuda", dtype=torch.bfloat16, generator=generator)
                      for _ in range(GRAPH_LAYERS)]
            activate = (lambda y: functional.gelu(y, approximate="tanh")) if activation == "gelu" else functional.relu
            outs: dict[str, list] = {}

            def ours():
                outs["ours"] = [nvtorch.linear(x, w, b, activation) for w, b in zip(weights, biases)]

            def theirs():
                outs["torch"] = [activate(functional.linear(x, w, b)) for w, b in zip(weights, biases)]

            graphs = {"nvblaslt.torch.linear": captured(torch, ours)[0],
                      "nn.Linear + activation": captured(torch, theirs)[0]}
            for graph in graphs.values():
                graph.replay()
            error = max(max_relative(torch, mine, reference) for mine, reference in zip(outs["ours"], outs["torch"]))
            cases = [(name, graph.replay) for name, graph in graphs.items()]
            samples = event_rounds(torch, cases, args.layer_rounds, GRAPH_REPLAYS)
            us = {name: statistics.median(values) * 1000 / GRAPH_LAYERS for (name, _), values in zip(cases, samples)}
            rows.append({"tokens": tokens, "in": d_in, "out": d_out, "activation": activation,
                         "ours_us": us["nvblaslt.torch.linear"], "torch_us": us["nn.Linear + activation"],
                         "ratio": us["nvblaslt.torch.linear"] / us["nn.Linear + activation"],
                         "max_relative_error": error})
            del graphs, cases, outs
    results["graph"] = {"layers": GRAPH_LAYERS, "replays_per_sample": GRAPH_REPLAYS, "rounds": args.layer_rounds,
                        "rows": rows}
