"""The 16 epilogs as data: what each one reads and writes besides A, B, C and D.

cuBLASLt defines the semantics (see its epilogue docs); GELU is the tanh approximation
0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), not the exact erf form.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class MatmulEpilog(enum.IntEnum):
    """The fusable epilogs; values are cuBLASLt's ``cublasLtEpilogue_t`` (checked by the tests)."""

    DEFAULT = 1
    RELU = 2
    RELU_AUX = 130
    BIAS = 4
    RELU_BIAS = 6
    RELU_AUX_BIAS = 134
    DRELU = 136
    DRELU_BGRAD = 152
    GELU = 32
    GELU_AUX = 160
    GELU_BIAS = 36
    GELU_AUX_BIAS = 164
    DGELU = 192
    DGELU_BGRAD = 208
    BGRADA = 256
    BGRADB = 512


@dataclass(frozen=True)
class EpilogSpec:
    bias_input: bool = False  # reads epilog_inputs["bias"] (length M) through BIAS_POINTER
    aux_input: str | None = None  # reads this aux (relu_aux / gelu_aux) through EPILOGUE_AUX_POINTER
    aux_output: str | None = None  # writes this aux through EPILOGUE_AUX_POINTER
    bias_output: str | None = None  # writes this bias gradient through BIAS_POINTER
    bias_output_length: str = "m"  # the gradient's length: rows (m) or columns (n) of D

    @property
    def inputs(self) -> tuple[str, ...]:
        return (("bias",) if self.bias_input else ()) + ((self.aux_input,) if self.aux_input else ())

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(o for o in (self.aux_output, self.bias_output) if o)


SPECS = {
    MatmulEpilog.DEFAULT: EpilogSpec(),
    MatmulEpilog.RELU: EpilogSpec(),
    MatmulEpilog.RELU_AUX: EpilogSpec(aux_output="relu_aux"),
    MatmulEpilog.BIAS: EpilogSpec(bias_input=True),
    MatmulEpilog.RELU_BIAS: EpilogSpec(bias_input=True),
    MatmulEpilog.RELU_AUX_BIAS: EpilogSpec(bias_input=True, aux_output="relu_aux"),
    MatmulEpilog.DRELU: EpilogSpec(aux_input="relu_aux"),
    MatmulEpilog.DRELU_BGRAD: EpilogSpec(aux_input="relu_aux", bias_output="drelu_bgrad"),
    MatmulEpilog.GELU: EpilogSpec(),
    MatmulEpilog.GELU_AUX: EpilogSpec(aux_output="gelu_aux"),
    MatmulEpilog.GELU_BIAS: EpilogSpec(bias_input=True),
    MatmulEpilog.GELU_AUX_BIAS: EpilogSpec(bias_input=True, aux_output="gelu_aux"),
    MatmulEpilog.DGELU: EpilogSpec(aux_input="gelu_aux"),
    MatmulEpilog.DGELU_BGRAD: EpilogSpec(aux_input="gelu_aux", bias_output="dgelu_bgrad"),
    MatmulEpilog.BGRADA: EpilogSpec(bias_output="bgrada", bias_output_length="m"),
    MatmulEpilog.BGRADB: EpilogSpec(bias_output="bgradb", bias_output_length="n"),
}

# Aux leading dimensions cuBLASLt accepts: the ReLU bitmask in bits, a multiple of 128;
# the GELU pre-activation in elements, a multiple of 8.
RELU_AUX_LD_MULTIPLE_BITS = 128
GELU_AUX_LD_MULTIPLE = 8


def relu_aux_ld_bytes(m: int) -> int:
    return -(-m // RELU_AUX_LD_MULTIPLE_BITS) * RELU_AUX_LD_MULTIPLE_BITS // 8


def gelu_aux_ld(m: int) -> int:
    return -(-m // GELU_AUX_LD_MULTIPLE) * GELU_AUX_LD_MULTIPLE


def as_epilog(epilog) -> MatmulEpilog:
    """Accept a MatmulEpilog, its name, its cuBLASLt value, or None (DEFAULT)."""
    from ._errors import NvblasltTypeError, NvblasltValueError

    if epilog is None:
        return MatmulEpilog.DEFAULT
    if isinstance(epilog, str):
        try:
            return MatmulEpilog[epilog.upper()]
        except KeyError:
            raise NvblasltValueError(f"epilog: expected one of {', '.join(MatmulEpilog.__members__)}, "
                                     f"got {epilog!r}") from None
    if isinstance(epilog, bool) or not isinstance(epilog, int):
        raise NvblasltTypeError(f"epilog: expected a MatmulEpilog, got {type(epilog).__name__} {epilog!r}")
    try:
        return MatmulEpilog(int(epilog))
    except ValueError:
        raise NvblasltValueError(f"epilog: expected one of {', '.join(MatmulEpilog.__members__)}, "
                                 f"got value {int(epilog)}") from None
