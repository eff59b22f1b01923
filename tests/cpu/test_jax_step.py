"""The bench's MLP training step (``nvblaslt.jax.dense``, bf16, 4096↔16384) as JAX lowers it for CUDA, read on
the CPU: every operation between nvblaslt's GEMMs. A step is its GEMMs and transposes that cancel in pairs
(a result's transpose into the caller's layout, undone where the next GEMM reads it), which XLA's
simplifier removes: no copy of the GELU aux between the forward and the backward, and no cast but the
float32 bias sums XLA fuses where it makes dz. Anything else would be a pass over memory on the GPU, and is
caught here.
"""

from __future__ import annotations

import re

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from tests import skips  # noqa: E402

skips.without_library()

import nvblaslt.jax as nj  # noqa: E402

S = jax.ShapeDtypeStruct
WIDTHS, TOKENS = (4096, 16384, 4096, 16384, 4096), 8192
_OP = re.compile(r"^\s*(%[\w#:]+) = (stablehlo\.\w+|\"?[\w.]+\"?)[ (](.*)$")


def _program(activation: str, backward: str = "auto") -> list[tuple[str, str, str]]:
    """The step's operations as (result, op, rest of the line), in order."""
    dtype = jnp.bfloat16
    params = [(S((a, b), dtype), S((b,), dtype)) for a, b in zip(WIDTHS, WIDTHS[1:])]
    acts = (activation,) * 3 + ("none",)

    def step(p, x, dy):  # the bench's step: weight and bias gradients
        return jax.vjp(lambda q: nj.dense(x, q, acts, backward=backward), p)[1](dy)[0]

    text = jax.jit(step).trace(params, S((TOKENS, WIDTHS[0]), dtype), S((TOKENS, WIDTHS[-1]), dtype)).lower(
        lowering_platforms=("cuda",)).as_text()
    body = text[text.index("func.func public @main"):]
    body = body[:body.index("\n  }\n")]  # main alone, not the private functions it calls
    return [m.groups() for m in map(_OP.match, body.splitlines()) if m]


def _uncancelled(ops: list) -> list[str]:
    """Ops other than the GEMMs, once each transpose whose operand is a transpose that it undoes is paired off."""
    transposes = {}
    for result, op, rest in ops:
        if op == "stablehlo.transpose":
            operand = re.match(r"(%[\w#]+)", rest.strip()).group(1)
            perm = tuple(int(d) for d in re.search(r"dims = \[([\d, ]*)\]", rest).group(1).split(","))
            transposes[result] = (operand, perm)
    paired = set()
    for result, (operand, perm) in transposes.items():
        inner = transposes.get(operand)
        if inner is not None and tuple(inner[1][axis] for axis in perm) == tuple(range(len(perm))):
            paired |= {result, operand}
    return [op for result, op, _ in ops if op != "stablehlo.custom_call" and result not in paired]


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_step_is_its_gemms_and_cancelling_transposes(activation):
    ops = _program(activation)
    calls = [op for _, op, _ in ops if op == "stablehlo.custom_call"]
    assert len(calls) == 10  # 4 forward; per layer its weight gradient, and the input gradients of layers 2-4
    left = _uncancelled(ops)
    # the bias gradients XLA sums in float32: each layer's whose dz XLA made (the top layer's, and with ReLU's
    # backward by XLA every layer's, fused into the mask's select); below a fused DGELU, BGRADA sums it
    assert left.count("stablehlo.reduce") == (1 if activation == "gelu" else 4)
    if activation == "gelu":  # DGELU in the next layer's input-gradient GEMM
        assert set(left) == {"stablehlo.reduce", "stablehlo.convert", "stablehlo.constant"}
    else:  # ReLU's backward by XLA from the layer's output ("auto"): its mask, and nothing that moves a result
        assert not {"stablehlo.transpose", "stablehlo.copy"} & set(left)
        assert "stablehlo.select" in left or "call" in left


def test_the_gelu_aux_reaches_the_backward_as_the_forward_wrote_it():
    """The GELU_AUX_BIAS forward's pre-activation goes to the DGELU GEMM through two transposes that cancel:
    the same buffer, read in the layout it was written in (no copy, no slice of padding rows)."""
    ops = _program("gelu")
    results = {result: (op, rest) for result, op, rest in ops}
    forwards = [result for result, op, rest in ops if op == "stablehlo.custom_call"][:3]  # the GELU layers
    assert all(result.endswith(":2") for result in forwards)  # D and the aux
    for forward in forwards:
        aux = forward.split(":")[0] + "#1"
        (first,) = [r for r, (op, rest) in results.items() if op == "stablehlo.transpose" and rest.startswith(aux)]
        (second,) = [r for r, (op, rest) in results.items() if op == "stablehlo.transpose" and
                     rest.startswith(first + ",")]
        readers = [r for r, (op, rest) in results.items() if op == "stablehlo.custom_call" and
                   re.search(re.escape(second) + r"\b", rest)]
        assert len(readers) == 1  # one DGELU GEMM reads it
