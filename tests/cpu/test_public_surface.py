"""What the user's ``Matmul`` shows: exactly the members the API reference documents (nvmath-python's
``Matmul`` and nvblaslt's additions), and none of the package's internal interface (no GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import nvblaslt
from nvblaslt import _protocols

API_REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "api.rst"


def documented_members(cls_name: str) -> set[str]:
    """The ``:members:`` list of ``.. autoclass:: cls_name`` in docs/api.rst (it may wrap lines)."""
    text = API_REFERENCE.read_text()
    found = re.search(rf"^\.\. autoclass:: {cls_name}\n   :members: ((?:.*\n)(?:             .*\n)*)", text,
                      re.MULTILINE)
    assert found, f"docs/api.rst documents no members of {cls_name}"
    return {name.strip() for name in found.group(1).replace("\n", " ").split(",") if name.strip()}


def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_matmul_shows_exactly_its_documented_members():
    documented = documented_members("Matmul")
    # nvmath-python's Matmul, and nvblaslt's documented additions (reset_operands_unchecked, algorithm)
    assert {"plan", "autotune", "execute", "reset_operands", "release_operands", "free", "algorithms",
            "applicable_algorithm_ids", "reset_operands_unchecked", "algorithm"} == documented
    assert public_names(nvblaslt.Matmul) == documented


def test_the_internal_interface_is_underscored_and_declared():
    """Every underscored method the package calls on a plan is declared by a protocol and defined by
    Matmul; none shows without its underscore."""
    declared = {name for protocol in (_protocols.PlanInternals, _protocols.TunablePlan, _protocols.TunedPlan)
                for name in vars(protocol) if name.startswith("_") and not name.startswith("__")
                and callable(getattr(protocol, name)) and not name.startswith("_abc")}
    assert {"_run", "_rebind", "_set_operands", "_forget_arrays", "_apply_tuning", "_from_operands",
            "_planned_for", "_use_fused_form", "_trial_run", "_make_split_form"} <= declared
    for name in declared:
        assert callable(getattr(nvblaslt.Matmul, name, None)), f"Matmul lacks {name}, which _protocols declares"
        assert not hasattr(nvblaslt.Matmul, name[1:]), f"Matmul shows {name[1:]} to the user"


def test_a_name_added_to_matmul_is_caught():
    """The comparison above fails for a public name the reference does not list."""

    class Grown(nvblaslt.Matmul):
        def rebind(self):  # an internal method made public again
            pass

    assert public_names(Grown) - documented_members("Matmul") == {"rebind"}
