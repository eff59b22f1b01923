"""What the user's ``Matmul`` and ``GroupedMatmul`` show: exactly the members the API reference documents
(for ``Matmul``, nvmath-python's and nvblaslt's additions) and the attributes their docstrings list, and
none of the package's internal interface, on the class or on a planned object (no GPU: stand-ins)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import nvblaslt
from nvblaslt import _protocols
from nvblaslt._launch import Launch
from tests.cpu.test_grouped_plan import OUT, gpu_standins, operands  # noqa: F401  (gpu_standins: a fixture)
from tests.fakes import FakeDLPack, StandInLaunch

API_REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "api.rst"


def documented_members(cls_name: str) -> set[str]:
    """The ``:members:`` list of ``.. autoclass:: cls_name`` in docs/api.rst (it may wrap lines)."""
    text = API_REFERENCE.read_text()
    found = re.search(rf"^\.\. autoclass:: {cls_name}\n   :members: ((?:.*\n)(?:             .*\n)*)", text,
                      re.MULTILINE)
    assert found, f"docs/api.rst documents no members of {cls_name}"
    return {name.strip() for name in found.group(1).replace("\n", " ").split(",") if name.strip()}


def documented_attributes(cls: type) -> set[str]:
    """The names the ``Attributes`` section of ``cls``'s docstring lists (numpydoc: ``name : type``)."""
    doc = inspect.getdoc(cls) or ""
    found = re.search(r"^Attributes\n-+\n(.*?)(?=^\S[^\n]*\n-+\n|\Z)", doc, re.MULTILINE | re.DOTALL)
    assert found, f"{cls.__name__}'s docstring has no Attributes section"
    return set(re.findall(r"^(\w+) :", found.group(1), re.MULTILINE))


def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def shown(obj: object) -> set[str]:
    """What a user reads on ``obj``: its class's public names and its own public attributes."""
    return public_names(type(obj)) | {name for name in vars(obj) if not name.startswith("_")}


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


def test_a_planned_matmul_shows_exactly_its_documented_attributes(monkeypatch, default_lib):
    """A user's object, made, planned and freed, shows the documented methods and attributes alone: an
    internal attribute assigned without its underscore (``launch``, ``problem``, ``fast_bound``…) fails."""
    monkeypatch.setattr(Launch, "planned", classmethod(lambda cls, *args, **kwargs: (StandInLaunch(), ["algo"], {})))
    documented = documented_members("Matmul") | documented_attributes(nvblaslt.Matmul)
    assert documented_attributes(nvblaslt.Matmul) == {"tuning_report", "device", "stream", "bias_gradient_form"}
    mm = nvblaslt.Matmul(FakeDLPack((8, 4)), FakeDLPack((4, 6), ptr=0x7F0000100000))
    assert shown(mm) <= documented
    mm.plan(epilog="RELU")
    assert shown(mm) == documented
    mm.free()
    assert shown(mm) == documented


def test_an_internal_attribute_made_public_is_caught(monkeypatch, default_lib):
    """The comparison above fails for an instance attribute the docstring does not list."""
    monkeypatch.setattr(Launch, "planned", classmethod(lambda cls, *args, **kwargs: (StandInLaunch(), ["algo"], {})))
    mm = nvblaslt.Matmul(FakeDLPack((8, 4)), FakeDLPack((4, 6), ptr=0x7F0000100000))
    mm.plan()
    mm.launch = mm._launch  # as it was named before
    assert shown(mm) - documented_members("Matmul") - documented_attributes(nvblaslt.Matmul) == {"launch"}


def test_a_planned_grouped_matmul_shows_exactly_its_documented_members_and_attributes(gpu_standins):
    """A grouped plan, made, planned, run and freed, shows what docs/api.rst and its docstring document;
    its launch, descriptors, arrays and hot path (``_run_pointers``) stay underscored."""
    documented = documented_members("GroupedMatmul") | documented_attributes(nvblaslt.GroupedMatmul)
    assert documented_attributes(nvblaslt.GroupedMatmul) == {"tuning_report", "device"}
    assert public_names(nvblaslt.GroupedMatmul) == documented_members("GroupedMatmul")
    a, b, offs, _ = operands()
    plan = nvblaslt.GroupedMatmul(a, b, offs)
    assert shown(plan) == documented
    plan.plan()
    plan.execute(out=FakeDLPack((40, 96), dtype="bfloat16", ptr=OUT))
    assert shown(plan) == documented
    plan.free()
    assert shown(plan) == documented
