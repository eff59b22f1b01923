"""``Algorithm.get`` / ``set`` / ``capability`` name their attribute as the descriptors' ``get`` /
``set`` do (no GPU: a zeroed ``cublasLtMatmulAlgo_t``): an unknown name is an ``NvblasltValueError``
naming it and listing the known ones (it was a raw ``KeyError``), and another enum's member an
``NvblasltTypeError`` (it went to the other enum's C getter, which read the 64-byte struct as a
descriptor)."""

from __future__ import annotations

import pytest

from nvblaslt import Algorithm, MatmulDesc, NvblasltTypeError, NvblasltValueError, lt

CONFIG, CAPABILITIES = "cublasLtMatmulAlgoConfigAttributes_t", "cublasLtMatmulAlgoCapAttributes_t"


@pytest.fixture
def algorithm(default_lib):
    return Algorithm(lt.cublasLtMatmulAlgo_t(), default_lib)


CALLS = {
    "get": (lambda algorithm, attribute: algorithm.get(attribute), CONFIG),
    "set": (lambda algorithm, attribute: algorithm.set(attribute, 1), CONFIG),
    "capability": (lambda algorithm, attribute: algorithm.capability(attribute), CAPABILITIES),
}


@pytest.mark.parametrize("call", CALLS)
def test_an_unknown_attribute_name_is_a_value_error_listing_the_known_ones(call, algorithm, default_lib):
    method, enum_name = CALLS[call]
    with pytest.raises(NvblasltValueError) as refused:
        method(algorithm, "splitk")
    message = str(refused.value)
    assert message.startswith(f"attribute: 'splitk' is not a member of {enum_name}; known: ")
    known = list(getattr(default_lib.api, enum_name).__members__)
    assert {"SPLITK_NUM", "TILE_IDS"} & set(known) and message.endswith(", ".join(known))
    assert isinstance(refused.value, ValueError) and not isinstance(refused.value, KeyError)


@pytest.mark.parametrize("call", CALLS)
def test_another_enums_member_or_a_bare_int_is_a_type_error(call, algorithm):
    method, enum_name = CALLS[call]
    for attribute in (lt.CUBLASLT_MATMUL_DESC_TRANSA, 3):
        with pytest.raises(NvblasltTypeError, match=rf"^attribute: expected a {enum_name} member or its name, "
                                                    rf"got {attribute!r}$"):
            method(algorithm, attribute)


def test_the_descriptors_refuse_the_same_way(default_lib):
    desc = MatmulDesc(lt.CUBLAS_COMPUTE_32F, lt.CUDA_R_32F)
    with pytest.raises(NvblasltValueError, match=r"^attribute: 'splitk' is not a member of "
                                                 r"cublasLtMatmulDescAttributes_t; known: "):
        desc.get("splitk")
    with pytest.raises(NvblasltTypeError, match=r"^attribute: expected a cublasLtMatmulDescAttributes_t member"):
        desc.set(lt.CUBLASLT_ALGO_CONFIG_ID, 1)


def test_names_and_members_still_work_in_any_case(algorithm):
    algorithm.set("splitk_num", 4)
    assert algorithm.get("SPLITK_NUM") == algorithm.get(lt.CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == 4
