"""Admission decisions (services.validator.admission): pure tables, no I/O."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import pytest

from services.validator import admission
from shared import api

Doc = dict[str, Any]
Mutation = Callable[[Doc], None]


def _nw_doc() -> Doc:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": "nw"},
        "spec": {
            "packages": {
                "a": {"version": "1.0.0", "image": "r/a"},
                "b": {"version": "2.0.0", "image": "r/b"},
            }
        },
    }


def _nw(*mutations: Mutation) -> api.NodeWright:
    doc = _nw_doc()
    for mutate in mutations:
        mutate(doc)
    return api.from_dict(doc, api.NodeWright)


def spec(**fields: Any) -> Mutation:
    return lambda doc: doc["spec"].update(copy.deepcopy(fields))


def pkg(name: str, **fields: Any) -> Mutation:
    return lambda doc: doc["spec"]["packages"].setdefault(name, {}).update(copy.deepcopy(fields))


def drop(name: str) -> Mutation:
    return lambda doc: doc["spec"]["packages"].pop(name)


def annotate(**values: str) -> Mutation:
    return lambda doc: (
        doc["metadata"]
        .setdefault("annotations", {})
        .update({f"{api.GROUP}/{k}": v for k, v in values.items()})
    )


def label(**values: str) -> Mutation:
    return lambda doc: doc["metadata"].setdefault("labels", {}).update(values)


UNINSTALLABLE = pkg("a", uninstall={"enabled": True})
NEW = pkg("new", version="1", image="r/new")


class Case(msgspec.Struct, frozen=True, kw_only=True):
    new: tuple[Mutation, ...] = ()
    old: tuple[Mutation, ...] | None = None
    policies: frozenset[str] = frozenset()
    inventory: Mapping[str, Mapping[str, int]] = msgspec.field(default_factory=dict)
    denied_at: tuple[str, ...] = ()
    """Fields of the expected violations, in order; empty: allowed."""
    says: str = ""
    """A fragment the message (denied) or a warning (allowed) must contain."""


NODEWRIGHT_CASES = [
    pytest.param(Case(), id="plain-create-allowed"),
    pytest.param(
        Case(new=(spec(deploymentPolicy="p"),), policies=frozenset({"p"})),
        id="existing-policy-allowed",
    ),
    pytest.param(
        Case(new=(spec(deploymentPolicy="p"),), denied_at=("spec.deploymentPolicy",), says="'p'"),
        id="missing-policy-denied",
    ),
    pytest.param(
        Case(
            old=(spec(deploymentPolicy="gone"),),
            new=(spec(deploymentPolicy="gone"), label(team="x")),
        ),
        id="metadata-update-with-missing-policy-allowed",
    ),
    pytest.param(
        Case(
            old=(spec(deploymentPolicy="gone"),),
            new=(spec(deploymentPolicy="gone", priority=7),),
        ),
        id="spec-update-keeping-missing-policy-allowed",
    ),
    pytest.param(
        Case(
            old=(spec(deploymentPolicy="p"),),
            new=(spec(deploymentPolicy="q"),),
            policies=frozenset({"p"}),
            denied_at=("spec.deploymentPolicy",),
        ),
        id="update-to-missing-policy-denied",
    ),
    pytest.param(
        Case(
            new=(pkg("Bad_Name", version="1", image="r/x"),), denied_at=("spec.packages[Bad_Name]",)
        ),
        id="package-name-syntax",
    ),
    pytest.param(
        Case(
            new=(pkg("a" * 44, version="1", image="r/x"),),
            denied_at=(f"spec.packages[{'a' * 44}]",),
        ),
        id="package-name-too-long",
    ),
    pytest.param(
        Case(new=(pkg("a\n", version="1", image="r/x"),), denied_at=("spec.packages[a\n]",)),
        id="package-name-trailing-newline",
    ),
    pytest.param(
        Case(
            new=(pkg("a", configMap={"x/y": "1"}),), denied_at=("spec.packages[a].configMap[x/y]",)
        ),
        id="config-key-slash",
    ),
    pytest.param(
        Case(new=(pkg("a", configMap={"..": "1"}),), denied_at=("spec.packages[a].configMap[..]",)),
        id="config-key-dotdot",
    ),
    pytest.param(
        Case(
            new=(
                pkg(
                    "a", configMap={"a.conf": "1"}, configInterrupts={"*.yaml": {"type": "reboot"}}
                ),
            ),
            denied_at=("spec.packages[a].configInterrupts[*.yaml]",),
            says="matches no key",
        ),
        id="config-interrupt-glob-matches-nothing",
    ),
    pytest.param(
        Case(
            new=(
                pkg(
                    "a",
                    configMap={"a.conf": "1", "b.yaml": "2"},
                    configInterrupts={"*.conf": {"type": "reboot"}, "b.yaml": {"type": "noop"}},
                ),
            )
        ),
        id="config-interrupt-glob-and-key-allowed",
    ),
    pytest.param(
        Case(new=(pkg("a", dependsOn={"zzz": "1"}),), denied_at=("spec.packages[a].dependsOn",)),
        id="depends-on-unknown",
    ),
    pytest.param(
        Case(
            new=(pkg("a", dependsOn={"b": "9.9.9"}),),
            denied_at=("spec.packages[a].dependsOn[b]",),
            says="version 2.0.0",
        ),
        id="depends-on-wrong-version",
    ),
    pytest.param(
        Case(new=(pkg("a", dependsOn={"a": "1.0.0"}),), denied_at=("spec.packages[a].dependsOn",)),
        id="depends-on-itself",
    ),
    pytest.param(
        Case(
            new=(
                pkg("a", dependsOn={"b": "2.0.0"}),
                pkg("b", uninstall={"enabled": True, "requested": True}),
            ),
            denied_at=("spec.packages[a].dependsOn[b]",),
            says="uninstall a too, or remove the dependency first",
        ),
        id="depends-on-a-package-being-uninstalled",
    ),
    pytest.param(
        Case(
            new=(
                pkg("a", dependsOn={"b": "2.0.0"}, uninstall={"enabled": True, "requested": True}),
                pkg("b", uninstall={"enabled": True, "requested": True}),
            ),
        ),
        id="a-dependency-uninstalled-with-its-dependent-allowed",
    ),
    pytest.param(
        Case(
            new=(pkg("a", dependsOn={"b": "2.0.0"}), pkg("b", dependsOn={"a": "1.0.0"})),
            denied_at=("spec.packages[a].dependsOn",),
            says="a -> b -> a",
        ),
        id="depends-on-cycle-of-two",
    ),
    pytest.param(
        Case(
            new=(
                pkg("c", version="3", image="r/c", dependsOn={"a": "1.0.0"}),
                pkg("a", dependsOn={"b": "2.0.0"}),
                pkg("b", dependsOn={"c": "3"}),
            ),
            denied_at=("spec.packages[a].dependsOn",),
            says="a -> b -> c -> a",
        ),
        id="depends-on-cycle-of-three",
    ),
    pytest.param(
        Case(
            new=(
                pkg("c", version="3", image="r/c", dependsOn={"a": "1.0.0", "b": "2.0.0"}),
                pkg("b", dependsOn={"a": "1.0.0"}),
            )
        ),
        id="depends-on-diamond-allowed",
    ),
    pytest.param(
        Case(
            new=(spec(nodeSelectors={"matchLabels": {"bad key": "x"}}),),
            denied_at=("spec.nodeSelectors.matchLabels[bad key]",),
        ),
        id="node-selector-label-key",
    ),
    pytest.param(
        Case(
            new=(
                spec(
                    podNonInterruptLabels={
                        "matchExpressions": [{"key": "k" * 64, "operator": "Exists"}]
                    }
                ),
            ),
            denied_at=("spec.podNonInterruptLabels.matchExpressions[0].key",),
        ),
        id="protected-pods-expression-key-too-long",
    ),
    pytest.param(
        Case(
            new=(spec(drain={"podSelector": {"matchLabels": {"-x": "y"}}}),),
            denied_at=("spec.drain.podSelector.matchLabels[-x]",),
        ),
        id="drain-pod-selector-label-key",
    ),
    pytest.param(
        Case(
            new=(spec(additionalTolerations=[{"key": "a" * 254 + "/b", "operator": "Exists"}]),),
            denied_at=("spec.additionalTolerations[0].key",),
        ),
        id="toleration-key-prefix-too-long",
    ),
    pytest.param(
        Case(
            new=(annotate(pause="yes"),),
            denied_at=(f"metadata.annotations[{api.PAUSE_ANNOTATION}]",),
        ),
        id="pause-annotation-value",
    ),
    pytest.param(
        Case(
            new=(annotate(disable="1"),),
            denied_at=(f"metadata.annotations[{api.DISABLE_ANNOTATION}]",),
        ),
        id="disable-annotation-value",
    ),
    pytest.param(Case(new=(annotate(pause="true", disable="false"),)), id="annotations-allowed"),
    pytest.param(
        Case(
            new=(annotate(**{"approved-batches": '{"__default__": 1}'}),),
            denied_at=(f"metadata.annotations[{api.GROUP}/approved-batches]",),
        ),
        id="approvals-not-objects",
    ),
    pytest.param(
        Case(
            new=(annotate(**{"approved-batches": '{"gpu": {"batch": 0}}'}),),
            denied_at=(f"metadata.annotations[{api.GROUP}/approved-batches]",),
        ),
        id="approval-of-batch-0",
    ),
    pytest.param(
        Case(
            new=(
                annotate(
                    **{
                        "approved-batches": '{"__default__": {"batch": 2, "finished": '
                        '"2026-12-07T12:00:03.120000+00:00"}, "gpu": {"batch": 1}}'
                    }
                ),
            )
        ),
        id="approvals-allowed",
    ),
    pytest.param(
        Case(old=(annotate(pause="yes"),), new=(annotate(pause="yes"), spec(priority=3))),
        id="unchanged-bad-annotation-not-re-judged",
    ),
    pytest.param(
        Case(
            old=(UNINSTALLABLE,),
            new=(drop("a"),),
            inventory={"a": {"1.0.0": 2}},
            denied_at=("spec.packages[a]",),
            says="present on 2 node(s)",
        ),
        id="remove-uninstallable-while-present",
    ),
    pytest.param(
        Case(old=(UNINSTALLABLE,), new=(drop("a"),), inventory={"a": {"1.0.0": 0}}),
        id="remove-uninstallable-after-uninstall",
    ),
    pytest.param(Case(old=(UNINSTALLABLE,), new=(drop("a"),)), id="remove-never-installed"),
    pytest.param(
        Case(
            old=(UNINSTALLABLE,),
            new=(drop("a"), NEW),
            inventory={"a": {"0.9.0": 1, "1.0.0": 0}},
            denied_at=("spec.packages[a]",),
        ),
        id="remove-uninstallable-with-older-version-present",
    ),
    pytest.param(
        Case(old=(), new=(drop("a"),), inventory={"a": {"1.0.0": 5}}, says="stays on the nodes"),
        id="remove-plain-package-warns",
    ),
    pytest.param(
        Case(
            old=(UNINSTALLABLE,),
            new=(UNINSTALLABLE, pkg("a", version="0.9.0")),
            inventory={"a": {"1.0.0": 1}},
            denied_at=("spec.packages[a].version",),
            says="downgrade",
        ),
        id="downgrade-uninstallable-while-present",
    ),
    pytest.param(
        Case(
            old=(UNINSTALLABLE,),
            new=(UNINSTALLABLE, pkg("a", version="v0.9")),
            inventory={"a": {"1.0.0": 0}},
        ),
        id="downgrade-after-uninstall",
    ),
    pytest.param(
        Case(
            old=(UNINSTALLABLE,),
            new=(UNINSTALLABLE, pkg("a", version="1.0.1")),
            inventory={"a": {"1.0.0": 4}},
        ),
        id="upgrade-uninstallable-while-present",
    ),
    pytest.param(
        Case(old=(), new=(pkg("a", version="0.1"),), inventory={"a": {"1.0.0": 4}}),
        id="downgrade-plain-package",
    ),
    pytest.param(
        Case(
            old=(pkg("a", uninstall={"enabled": True, "requested": True}),),
            new=(UNINSTALLABLE,),
            inventory={"a": {"1.0.0": 1}},
            says="cancelling an uninstall",
        ),
        id="cancel-uninstall-warns",
    ),
    pytest.param(
        Case(new=(spec(sequencing="all", runtimeRequired=True),), says="runtime-required taint"),
        id="sequencing-all-with-runtime-required-warns",
    ),
    pytest.param(
        Case(
            new=(pkg("Bad", version="1", image="r/x"), spec(deploymentPolicy="p")),
            denied_at=("spec.packages[Bad]", "spec.deploymentPolicy"),
        ),
        id="violations-are-all-reported",
    ),
]


@pytest.mark.parametrize("case", NODEWRIGHT_CASES)
def test_nodewright_admission(case: Case) -> None:
    old = _nw(*case.old) if case.old is not None else None
    verdict = admission.review_nodewright(
        operation="UPDATE" if old is not None else "CREATE",
        old=old,
        new=_nw(*case.new),
        existing_policies=case.policies,
        inventory=case.inventory,
    )
    assert tuple(v.field for v in verdict.violations) == case.denied_at, verdict.message
    assert verdict.allowed == (not case.denied_at)
    if case.says:
        text = verdict.message if case.denied_at else " ".join(verdict.warnings)
        assert case.says in text


def test_nodewright_deletion_is_never_blocked_here() -> None:
    verdict = admission.review_nodewright(
        operation="DELETE",
        old=_nw(UNINSTALLABLE),
        new=None,
        existing_policies=frozenset(),
        inventory={"a": {"1.0.0": 3}},
    )
    assert verdict.allowed


def test_uninstall_guards_deny_with_forbidden() -> None:
    verdict = admission.review_nodewright(
        operation="UPDATE",
        old=_nw(UNINSTALLABLE),
        new=_nw(drop("a")),
        existing_policies=frozenset(),
        inventory={"a": {"1.0.0": 1}},
    )
    assert verdict.code == 403
    review = admission.respond("uid-1", verdict)
    assert review.response.status is not None
    assert review.response.status.reason == "Forbidden"


def test_inventory_comes_from_status_packages() -> None:
    status = api.NodeWrightStatus(
        packages=[
            api.PackageStatus(name="a", version="1", present_nodes=2),
            api.PackageStatus(name="a", version="0.9", present_nodes=0),
            api.PackageStatus(name="b", version="2", present_nodes=1),
        ]
    )
    assert admission.inventory_from_status(status) == {"a": {"1": 2, "0.9": 0}, "b": {"2": 1}}


# ---- DeploymentPolicy -----------------------------------------------------------------------


def _dp(**fields: Any) -> api.DeploymentPolicy:
    doc: Doc = {
        "apiVersion": api.API_VERSION,
        "kind": "DeploymentPolicy",
        "metadata": {"name": "dp"},
        "spec": {"default": {"budget": {"count": 1}}, **fields},
    }
    return api.from_dict(doc, api.DeploymentPolicy)


def _window(tz: str) -> dict[str, Any]:
    return {"start": "01:00", "end": "02:00", "timeZone": tz}


def _compartment(labels: dict[str, str]) -> dict[str, Any]:
    return {"name": "c", "selector": {"matchLabels": labels}, "budget": {"percent": 5}}


@pytest.mark.parametrize(
    ("operation", "old", "new", "users", "denied_at"),
    [
        pytest.param("CREATE", None, _dp(), [], (), id="create-allowed"),
        pytest.param(
            "CREATE",
            None,
            _dp(maintenanceWindows=[_window("Europe/Berlin"), _window("Mars/Olympus")]),
            [],
            ("spec.maintenanceWindows[1].timeZone",),
            id="unknown-time-zone",
        ),
        pytest.param(
            "CREATE",
            None,
            _dp(compartments=[_compartment({"a b": "x"})]),
            [],
            ("spec.compartments[0].selector.matchLabels[a b]",),
            id="compartment-label-key",
        ),
        pytest.param(
            "UPDATE",
            _dp(maintenanceWindows=[_window("Nowhere/Land")]),
            _dp(maintenanceWindows=[_window("Nowhere/Land")]),
            [],
            (),
            id="unchanged-spec-not-re-judged",
        ),
        pytest.param(
            "UPDATE",
            _dp(),
            _dp(maintenanceWindows=[_window("Nowhere/Land")]),
            [],
            ("spec.maintenanceWindows[0].timeZone",),
            id="update-to-unknown-time-zone",
        ),
        pytest.param("DELETE", _dp(), None, [], (), id="delete-unreferenced"),
        pytest.param("DELETE", _dp(), None, ["a", "b"], ("metadata.name",), id="delete-referenced"),
    ],
)
def test_deployment_policy_admission(
    operation: admission.Operation,
    old: api.DeploymentPolicy | None,
    new: api.DeploymentPolicy | None,
    users: list[str],
    denied_at: tuple[str, ...],
) -> None:
    verdict = admission.review_deployment_policy(
        operation=operation, old=old, new=new, referenced_by=users
    )
    assert tuple(v.field for v in verdict.violations) == denied_at, verdict.message


def test_deleting_a_referenced_policy_names_the_nodewrights_boundedly() -> None:
    users = [f"nw-{i:02d}" for i in range(12)]
    verdict = admission.review_deployment_policy(
        operation="DELETE", old=_dp(), new=None, referenced_by=users
    )
    assert "nw-00, nw-01" in verdict.message
    assert "nw-10" not in verdict.message
    assert "and 2 more" in verdict.message
    assert verdict.code == 403


# ---- AdmissionReview ------------------------------------------------------------------------


def test_a_denial_carries_causes_per_field() -> None:
    verdict = admission.Verdict(
        violations=(
            admission.Violation(field="spec.a", message="bad"),
            admission.Violation(field="spec.b", message="worse"),
        ),
        warnings=("careful",),
    )
    out = msgspec.json.decode(msgspec.json.encode(admission.respond("u", verdict)))
    assert out == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "u",
            "allowed": False,
            "status": {
                "code": 422,
                "reason": "Invalid",
                "message": "spec.a: bad; spec.b: worse",
                "details": {
                    "causes": [
                        {"field": "spec.a", "message": "bad", "reason": "FieldValueInvalid"},
                        {"field": "spec.b", "message": "worse", "reason": "FieldValueInvalid"},
                    ]
                },
            },
            "warnings": ["careful"],
        },
    }


def test_an_allowed_answer_has_no_status() -> None:
    out = msgspec.json.decode(msgspec.json.encode(admission.respond("u", admission.Verdict())))
    assert out["response"] == {"uid": "u", "allowed": True}


def test_a_request_object_of_null_decodes_to_none() -> None:
    request = msgspec.json.decode(
        b'{"uid":"u","kind":{"kind":"NodeWright"},"operation":"DELETE","object":null}',
        type=admission.AdmissionRequest,
    )
    assert admission.decode_object(request.object, api.NodeWright) is None
    assert admission.decode_object(request.old_object, api.NodeWright) is None
