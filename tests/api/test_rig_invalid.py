"""The API server itself refuses invalid NodeWrights and DeploymentPolicies (schema and CEL).

Each case starts from a valid object, breaks one thing, and expects a rejection whose message
names the offending field. Update cases store the valid object first and then replace it.
The webhook is not running here: these rejections come from the CRDs alone. Webhook cases
live in test_rig_webhook.py.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any, Literal

import msgspec
import pytest

from shared.kube import ApiError
from tests.api import crds
from tests.api.conftest import Objects, unique

pytestmark = pytest.mark.rig

Doc = dict[str, Any]


def nodewright() -> Doc:
    return {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "x"},
        "spec": {
            "packages": {
                "a": {"version": "1.0.0", "image": "ghcr.io/example/a"},
                "b": {"version": "2.0.0", "image": "ghcr.io/example/b"},
            }
        },
    }


def policy() -> Doc:
    return {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "DeploymentPolicy",
        "metadata": {"name": "x"},
        "spec": {"default": {"budget": {"count": 1}}},
    }


def at(path: str, value: Any) -> Callable[[Doc], None]:
    """Set a dotted path (list indexes as numbers) to ``value``; ``...`` deletes it."""

    def mutate(doc: Doc) -> None:
        parts = path.split(".")
        target: Any = doc
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
        if value is ...:
            del target[parts[-1]]
        else:
            target[parts[-1]] = copy.deepcopy(value)

    return mutate


def both(*mutations: Callable[[Doc], None]) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        for m in mutations:
            m(doc)

    return mutate


class Invalid(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["NodeWright", "DeploymentPolicy"] = "NodeWright"
    breaks: Callable[[Doc], None]
    names: tuple[str, ...]
    """Fragments the error message must contain: the field path first."""
    stored: Callable[[Doc], None] | None = None
    """For updates: how the valid stored object differs from the base (identity if None)."""
    update: bool = False
    status: bool = False
    """Break the status through the status subresource (an update)."""


def nw_create(breaks: Callable[[Doc], None], *names: str) -> Invalid:
    return Invalid(breaks=breaks, names=names)


def dp_create(breaks: Callable[[Doc], None], *names: str) -> Invalid:
    return Invalid(kind="DeploymentPolicy", breaks=breaks, names=names)


PKG = "spec.packages.a"
SERVICE = {"type": "service", "services": ["containerd.service"]}

CASES = [
    # ---- NodeWright, OpenAPI schema ---------------------------------------------------------
    pytest.param(
        nw_create(at("spec.packages", ...), "spec.packages", "Required"), id="nw-no-packages"
    ),
    pytest.param(
        nw_create(at("spec.packages", {}), "spec.packages", "at least 1"), id="nw-empty-packages"
    ),
    pytest.param(
        nw_create(at(f"{PKG}.image", ...), "spec.packages[a].image", "Required"), id="nw-no-image"
    ),
    pytest.param(
        nw_create(at("spec.interruptionBudget", {"percent": 0}), "spec.interruptionBudget.percent"),
        id="nw-percent-0",
    ),
    pytest.param(
        nw_create(
            at("spec.interruptionBudget", {"percent": 101}), "spec.interruptionBudget.percent"
        ),
        id="nw-percent-101",
    ),
    pytest.param(
        nw_create(at("spec.interruptionBudget", {"count": 0}), "spec.interruptionBudget.count"),
        id="nw-count-0",
    ),
    pytest.param(nw_create(at("spec.priority", 0), "spec.priority"), id="nw-priority-0"),
    pytest.param(
        nw_create(at("spec.sequencing", "cluster"), "spec.sequencing", "Unsupported value"),
        id="nw-sequencing",
    ),
    pytest.param(
        nw_create(at(f"{PKG}.interrupt", {"type": "shutdown"}), "spec.packages[a].interrupt.type"),
        id="nw-interrupt-type",
    ),
    pytest.param(
        nw_create(at("spec.drain.unmanagedPods", "Ignore"), "spec.drain.unmanagedPods"),
        id="nw-unmanaged-pods",
    ),
    pytest.param(
        nw_create(at("spec.drain.timeoutSeconds", -1), "spec.drain.timeoutSeconds"),
        id="nw-drain-timeout",
    ),
    pytest.param(
        nw_create(at("spec.stageTimeoutSeconds", 0), "spec.stageTimeoutSeconds"),
        id="nw-stage-timeout",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.gracefulShutdownSeconds", -5), "spec.packages[a].gracefulShutdownSeconds"
        ),
        id="nw-graceful-shutdown",
    ),
    pytest.param(
        nw_create(at(f"{PKG}.env", [{"name": "1BAD"}]), "spec.packages[a].env[0].name"),
        id="nw-env-name",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.env", [{"name": "A"}, {"name": "A", "value": "2"}]),
            "spec.packages[a].env[1]",
            "Duplicate",
        ),
        id="nw-env-duplicate",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.interrupt", {"type": "service", "services": ["bad unit"]}),
            "spec.packages[a].interrupt.services[0]",
        ),
        id="nw-service-name",
    ),
    pytest.param(
        nw_create(
            at("spec.nodeSelectors", {"matchExpressions": [{"key": "k", "operator": "Has"}]}),
            "spec.nodeSelectors.matchExpressions[0].operator",
        ),
        id="nw-selector-operator",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.resources", {"requests": {"cpu": "lots"}}),
            "spec.packages[a].resources.requests.cpu",
        ),
        id="nw-quantity-syntax",
    ),
    # ---- NodeWright, CEL --------------------------------------------------------------------
    pytest.param(
        nw_create(
            at("spec.interruptionBudget", {"percent": 5, "count": 2}),
            "spec.interruptionBudget",
            "exactly one of percent or count",
        ),
        id="nw-budget-both",
    ),
    pytest.param(
        nw_create(
            at("spec.interruptionBudget", {}),
            "spec.interruptionBudget",
            "exactly one of percent or count",
        ),
        id="nw-budget-neither",
    ),
    pytest.param(
        nw_create(at(f"{PKG}.version", "latest"), "spec.packages[a].version", "semantic version"),
        id="nw-version-word",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.version", "2024.07.01"), "spec.packages[a].version", "semantic version"
        ),
        id="nw-version-leading-zero",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.version", "1.0.0+build.5"), "spec.packages[a].version", "semantic version"
        ),
        id="nw-version-build",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.image", "ghcr.io/example/a:1.0.0"),
            "spec.packages[a].image",
            "must not include a tag",
        ),
        id="nw-image-tag",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.image", "registry.local:5000/a:v2"),
            "spec.packages[a].image",
            "must not include a tag",
        ),
        id="nw-image-port-and-tag",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.image", "ghcr.io/example/a@sha256:" + "0" * 64),
            "spec.packages[a].image",
            "must not include a digest",
        ),
        id="nw-image-digest",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.image", "ghcr.io/Example/A"),
            "spec.packages[a].image",
            "image reference without tag",
        ),
        id="nw-image-uppercase",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.digest", "sha256:abc"), "spec.packages[a].digest", "sha256:<64 hex digits>"
        ),
        id="nw-digest",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.interrupt", {"type": "service"}),
            "spec.packages[a].interrupt.services",
            "systemd units",
        ),
        id="nw-service-without-units",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.interrupt", {"type": "reboot", "services": ["a.service"]}),
            "spec.packages[a].interrupt.services",
            "must be empty",
        ),
        id="nw-reboot-with-units",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.uninstall", {"requested": True}),
            "spec.packages[a].uninstall.requested",
            "enabled: true",
        ),
        id="nw-uninstall-not-enabled",
    ),
    pytest.param(
        nw_create(
            both(at("spec.deploymentPolicy", "p"), at("spec.interruptionBudget", {"count": 1})),
            "spec.interruptionBudget",
            "not both",
        ),
        id="nw-policy-and-budget",
    ),
    pytest.param(
        nw_create(at("spec.autoTaintNewNodes", True), "spec.autoTaintNewNodes", "runtimeRequired"),
        id="nw-auto-taint-alone",
    ),
    pytest.param(
        nw_create(
            at("spec.deploymentPolicyOptions", {"resetBatchStateOnCompletion": False}),
            "spec.deploymentPolicyOptions",
            "needs deploymentPolicy",
        ),
        id="nw-options-without-policy",
    ),
    pytest.param(
        nw_create(at(f"{PKG}.dependsOn", {"zzz": "1.0.0"}), "spec.packages", "dependsOn"),
        id="nw-depends-on-unknown",
    ),
    pytest.param(
        nw_create(at(f"{PKG}.dependsOn", {"b": "9.9.9"}), "spec.packages", "dependsOn"),
        id="nw-depends-on-version",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "500m"}}),
            "spec.packages[a].resources.limits.cpu",
            "at least requests.cpu",
        ),
        id="nw-limit-below-request",
    ),
    pytest.param(
        nw_create(
            at(f"{PKG}.resources", {"requests": {"memory": 0}}),
            "spec.packages[a].resources.requests.memory",
            "positive Kubernetes quantity",
        ),
        id="nw-quantity-zero",
    ),
    pytest.param(
        nw_create(
            at(
                f"{PKG}.env",
                [
                    {
                        "name": "A",
                        "value": "1",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    }
                ],
            ),
            "spec.packages[a].env[0].valueFrom",
            "not both",
        ),
        id="nw-env-value-and-from",
    ),
    pytest.param(
        nw_create(
            at(
                f"{PKG}.env",
                [
                    {
                        "name": "A",
                        "valueFrom": {
                            "secretKeyRef": {"name": "s", "key": "k"},
                            "configMapKeyRef": {"name": "c", "key": "k"},
                        },
                    }
                ],
            ),
            "spec.packages[a].env[0].valueFrom",
            "exactly one of",
        ),
        id="nw-env-two-sources",
    ),
    pytest.param(
        nw_create(
            at("spec.nodeSelectors", {"matchExpressions": [{"key": "k", "operator": "In"}]}),
            "spec.nodeSelectors.matchExpressions[0].values",
            "non-empty",
        ),
        id="nw-selector-in-without-values",
    ),
    pytest.param(
        nw_create(
            at(
                "spec.podNonInterruptLabels",
                {"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]},
            ),
            "spec.podNonInterruptLabels.matchExpressions[0].values",
        ),
        id="nw-selector-exists-with-values",
    ),
    pytest.param(
        nw_create(
            at("spec.additionalTolerations", [{"key": "k", "operator": "Exists", "value": "v"}]),
            "spec.additionalTolerations[0].value",
            "empty when operator is Exists",
        ),
        id="nw-toleration-exists-value",
    ),
    pytest.param(
        nw_create(
            at(
                "spec.additionalTolerations",
                [{"key": "k", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 5}],
            ),
            "spec.additionalTolerations[0].tolerationSeconds",
            "NoExecute",
        ),
        id="nw-toleration-seconds",
    ),
    pytest.param(
        nw_create(
            at("spec.additionalTolerations", [{"value": "v"}]),
            "spec.additionalTolerations[0].operator",
            "key is empty",
        ),
        id="nw-toleration-empty-key",
    ),
    pytest.param(
        nw_create(at("metadata.name", "n" * 64), "metadata.name", "DNS label"),
        id="nw-name-too-long",
    ),
    pytest.param(
        nw_create(at("metadata.name", "has.dots"), "metadata.name", "DNS label"),
        id="nw-name-with-dots",
    ),
    # ---- NodeWright updates -----------------------------------------------------------------
    pytest.param(
        Invalid(
            stored=at(f"{PKG}.uninstall", {"enabled": True, "requested": True}),
            breaks=at(f"{PKG}.version", "1.1.0"),
            names=("spec.packages[a].version", "uninstall.requested"),
            update=True,
        ),
        id="nw-update-version-during-uninstall",
    ),
    pytest.param(
        Invalid(breaks=at("spec.priority", -3), names=("spec.priority",), update=True),
        id="nw-update-priority",
    ),
    pytest.param(
        Invalid(
            breaks=at(f"{PKG}.image", "ghcr.io/example/a:latest"),
            names=("spec.packages[a].image", "tag"),
            update=True,
        ),
        id="nw-update-image-tag",
    ),
    pytest.param(
        Invalid(
            stored=at("status", {"observedGeneration": 5}),
            breaks=at("status.observedGeneration", 4),
            names=("status.observedGeneration", "must not decrease"),
            status=True,
        ),
        id="nw-status-generation-decreases",
    ),
    pytest.param(
        Invalid(
            breaks=at(
                "status.nodeDetails",
                [{"node": f"n{i}", "state": "Failed", "reason": "StageFailed"} for i in range(21)],
            ),
            names=("status.nodeDetails", "20"),
            status=True,
        ),
        id="nw-status-node-details-unbounded",
    ),
    pytest.param(
        Invalid(
            breaks=at(
                "status.conditions",
                [
                    {
                        "type": "Ready",
                        "status": "Maybe",
                        "reason": "X",
                        "lastTransitionTime": "2030-01-01T00:00:00Z",
                    }
                ],
            ),
            names=("status.conditions[0].status",),
            status=True,
        ),
        id="nw-status-condition-status",
    ),
    # ---- DeploymentPolicy, OpenAPI schema ---------------------------------------------------
    pytest.param(
        dp_create(at("spec.default", ...), "spec.default", "Required"), id="dp-no-default"
    ),
    pytest.param(
        dp_create(at("spec.default.budget", ...), "spec.default.budget", "Required"),
        id="dp-no-budget",
    ),
    pytest.param(
        dp_create(at("spec.default.batchSuccessPercent", 0), "spec.default.batchSuccessPercent"),
        id="dp-success-percent-0",
    ),
    pytest.param(
        dp_create(
            at("spec.default.strategy", {"exponential": {"growthFactor": 1}}),
            "spec.default.strategy.exponential.growthFactor",
        ),
        id="dp-growth-factor-1",
    ),
    pytest.param(
        dp_create(
            at("spec.default.stopAfterConsecutiveFailedBatches", 0),
            "spec.default.stopAfterConsecutiveFailedBatches",
        ),
        id="dp-stop-after-0",
    ),
    pytest.param(
        dp_create(
            at("spec.default.shrinkAfterFailureUntilPercent", 101),
            "spec.default.shrinkAfterFailureUntilPercent",
        ),
        id="dp-shrink-101",
    ),
    pytest.param(
        dp_create(
            at("spec.maintenanceWindows", [{"start": "01:00", "end": "02:00", "days": ["Funday"]}]),
            "spec.maintenanceWindows[0].days[0]",
        ),
        id="dp-window-day",
    ),
    pytest.param(
        dp_create(
            at(
                "spec.compartments",
                [
                    {"name": "c", "selector": {"matchLabels": {"a": "1"}}, "budget": {"count": 1}},
                    {"name": "c", "selector": {"matchLabels": {"a": "2"}}, "budget": {"count": 1}},
                ],
            ),
            "spec.compartments[1]",
            "Duplicate",
        ),
        id="dp-compartment-duplicate-name",
    ),
    pytest.param(
        dp_create(
            at("spec.compartments", [{"name": "c", "budget": {"count": 1}}]),
            "spec.compartments[0].selector",
            "Required",
        ),
        id="dp-compartment-no-selector",
    ),
    # ---- DeploymentPolicy, CEL --------------------------------------------------------------
    pytest.param(
        dp_create(
            at("spec.default.strategy", {"fixed": {}, "linear": {}}),
            "spec.default.strategy",
            "exactly one of fixed, linear or exponential",
        ),
        id="dp-two-strategies",
    ),
    pytest.param(
        dp_create(
            at("spec.default.strategy", {}),
            "spec.default.strategy",
            "exactly one of fixed, linear or exponential",
        ),
        id="dp-no-strategy-kind",
    ),
    pytest.param(
        dp_create(
            at("spec.default.budget", {"percent": 10, "count": 1}),
            "spec.default.budget",
            "exactly one of percent or count",
        ),
        id="dp-budget-both",
    ),
    pytest.param(
        dp_create(
            at("spec.sharedBudget", {}), "spec.sharedBudget", "exactly one of percent or count"
        ),
        id="dp-shared-budget-empty",
    ),
    pytest.param(
        dp_create(
            at("spec.compartments", [{"name": "c", "selector": {}, "budget": {"count": 1}}]),
            "spec.compartments[0].selector",
            "must not be empty",
        ),
        id="dp-compartment-empty-selector",
    ),
    pytest.param(
        dp_create(
            at(
                "spec.compartments",
                [
                    {"name": "c1", "selector": {"matchLabels": {"a": "1"}}, "budget": {"count": 1}},
                    {"name": "c2", "selector": {"matchLabels": {"a": "1"}}, "budget": {"count": 2}},
                ],
            ),
            "spec.compartments",
            "different selectors",
        ),
        id="dp-compartment-same-selector",
    ),
    pytest.param(
        dp_create(
            at(
                "spec.compartments",
                [
                    {
                        "name": "__default__",
                        "selector": {"matchLabels": {"a": "1"}},
                        "budget": {"count": 1},
                    }
                ],
            ),
            "spec.compartments[0].name",
            "DNS label",
        ),
        id="dp-compartment-name",
    ),
    pytest.param(
        dp_create(
            at("spec.maintenanceWindows", [{"start": "22:00", "end": "22:00"}]),
            "spec.maintenanceWindows[0].end",
            "must differ",
        ),
        id="dp-window-empty",
    ),
    pytest.param(
        dp_create(
            at("spec.maintenanceWindows", [{"start": "25:00", "end": "02:00"}]),
            "spec.maintenanceWindows[0].start",
            "HH:MM",
        ),
        id="dp-window-start",
    ),
    pytest.param(
        dp_create(
            at(
                "spec.maintenanceWindows",
                [{"start": "01:00", "end": "02:00", "timeZone": "UTC+1:00"}],
            ),
            "spec.maintenanceWindows[0].timeZone",
            "IANA",
        ),
        id="dp-window-zone-syntax",
    ),
    pytest.param(
        dp_create(at("metadata.name", "p" * 64), "metadata.name", "DNS label"),
        id="dp-name-too-long",
    ),
    # ---- DeploymentPolicy updates -----------------------------------------------------------
    pytest.param(
        Invalid(
            kind="DeploymentPolicy",
            breaks=at("spec.default.strategy", {"fixed": {}, "exponential": {}}),
            names=("spec.default.strategy", "exactly one"),
            update=True,
        ),
        id="dp-update-two-strategies",
    ),
    pytest.param(
        Invalid(
            kind="DeploymentPolicy",
            breaks=at("spec.default.budget", {"count": -1}),
            names=("spec.default.budget.count",),
            update=True,
        ),
        id="dp-update-negative-count",
    ),
]


def test_there_are_at_least_forty_distinct_cases() -> None:
    ids = [p.id for p in CASES]
    assert len(set(ids)) == len(ids) >= 40


@pytest.mark.parametrize("case", CASES)
async def test_the_api_server_refuses(objects: Objects, case: Invalid) -> None:
    base = nodewright() if case.kind == "NodeWright" else policy()
    base["metadata"]["name"] = unique()
    where = crds.collection(case.kind)
    if not (case.update or case.status):
        case.breaks(base)
        with pytest.raises(ApiError) as err:
            await objects.create(base)
    else:
        stored_doc = copy.deepcopy(base)
        stored_doc.pop("status", None)
        if case.stored is not None:
            case.stored(stored_doc)
        status = stored_doc.pop("status", None)
        stored = await objects.create(stored_doc)
        path = f"{where}/{stored['metadata']['name']}"
        if status is not None:
            stored = await objects.kube.replace(f"{path}/status", {**stored, "status": status})
        changed = copy.deepcopy(stored)
        case.breaks(changed)
        target = f"{path}/status" if case.status else path
        with pytest.raises(ApiError) as err:
            await objects.kube.replace(target, changed)
    assert err.value.status in (400, 403, 422), err.value
    message = _dotted(err.value.message)
    for fragment in case.names:
        assert _dotted(fragment) in message, err.value.message


def _dotted(text: str) -> str:
    # OpenAPI errors write map entries as spec.packages.a, CEL errors as spec.packages[a]; the
    # field is named either way. Numeric list indexes keep their brackets.
    return re.sub(r"\[([A-Za-z_][-\w.]*)\]", r".\1", text)
