"""Admission decisions for NodeWright and DeploymentPolicy that the CRD schema cannot make.

The CRDs (generated from ``shared.api``) already reject malformed fields with OpenAPI and CEL
rules. What remains needs another object, a graph walk or more CEL cost than a map of
unbounded keys allows: map-key syntax (package names, configMap keys, label keys),
configInterrupts globs, dependsOn cycles and unknown names, a referenced DeploymentPolicy
that does not exist, removing or downgrading an uninstall-enabled package before its
uninstall finished, deleting a DeploymentPolicy still referenced, and time zones.

Everything here is a pure function of (operation, old object, new object, lookups passed in as
data): no I/O imports. The aiohttp server in ``webhook`` decodes AdmissionReviews, fetches the
lookups and encodes the answer. Uninstall progress is read from the old object's
``status.packages`` (nodes where each package version is present), which the status service
computes from the Node annotations; a version present on 0 nodes has finished uninstalling.
"""

from __future__ import annotations

import fnmatch
import re
import zoneinfo
from collections.abc import Iterator, Mapping, Sequence
from typing import Final, Literal

import msgspec

from shared import api
from shared.rollout import approvals

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
PackageInventory = Mapping[str, Mapping[str, int]]
"""package name -> version -> number of nodes where that version is present."""

# A denial names at most this many objects, so a message stays readable at any scale.
_MAX_NAMED: Final = 10


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    """One reason to deny, at one field."""

    field: str
    """JSON path of the offending field, e.g. spec.packages[a].dependsOn."""
    message: str
    reason: Literal["FieldValueInvalid", "FieldValueNotFound", "FieldValueForbidden"] = (
        "FieldValueInvalid"
    )


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The admission answer: allowed, or denied with the violations; warnings either way."""

    violations: tuple[Violation, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.violations

    @property
    def message(self) -> str:
        return "; ".join(f"{v.field}: {v.message}" for v in self.violations)

    @property
    def code(self) -> int:
        """HTTP status for a denial: 403 when the request conflicts with state, else 422."""
        if any(v.reason == "FieldValueForbidden" for v in self.violations):
            return 403
        return 422


def _named(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_MAX_NAMED])
    more = len(names) - _MAX_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


# ---- NodeWright ---------------------------------------------------------------------------


def inventory_from_status(status: api.NodeWrightStatus) -> dict[str, dict[str, int]]:
    """Where each package version is present, from a NodeWright's status.packages."""
    out: dict[str, dict[str, int]] = {}
    for p in status.packages:
        out.setdefault(p.name, {})[p.version] = p.present_nodes
    return out


def review_nodewright(
    *,
    operation: Operation,
    old: api.NodeWright | None,
    new: api.NodeWright | None,
    existing_policies: frozenset[str],
    inventory: PackageInventory,
) -> Verdict:
    """Admit a NodeWright CREATE or UPDATE (DELETE is always allowed: the finalizer uninstalls).

    Args:
        operation: the admission operation.
        old: the stored object (UPDATE).
        new: the object as it would be stored (CREATE, UPDATE).
        existing_policies: names of DeploymentPolicies known to exist; must contain
            ``new.spec.deploymentPolicy`` when that is set or changed.
        inventory: where package versions are present (see :func:`inventory_from_status`).
    """
    if operation not in ("CREATE", "UPDATE") or new is None:
        return Verdict()
    violations = list(_annotations(old, new))
    warnings: list[str] = []
    # A metadata-only update (finalizers, labels) must never be wedged by a spec check: the
    # spec was admitted before, and the world it was checked against may have moved on.
    if old is None or old.spec != new.spec:
        violations += _spec(new.spec)
        if new.spec.deployment_policy is not None and (
            old is None or old.spec.deployment_policy != new.spec.deployment_policy
        ):
            violations += _policy_exists(new.spec.deployment_policy, existing_policies)
        if old is not None:
            violations += _uninstall_guards(old.spec, new.spec, inventory)
            warnings += _update_warnings(old.spec, new.spec, inventory)
        warnings += _spec_warnings(new.spec)
    return Verdict(violations=tuple(violations), warnings=tuple(warnings))


def _annotations(old: api.NodeWright | None, new: api.NodeWright) -> Iterator[Violation]:
    def changed(key: str) -> str | None:
        value = new.metadata.annotations.get(key)
        unchanged = old is not None and old.metadata.annotations.get(key) == value
        return None if unchanged else value

    for key in (api.PAUSE_ANNOTATION, api.DISABLE_ANNOTATION):
        value = changed(key)
        if value is not None and value not in ("true", "false"):
            yield Violation(
                field=f"metadata.annotations[{key}]",
                message=f'must be "true" or "false", got {value!r}',
            )
    if changed(approvals.APPROVALS_ANNOTATION) is not None:
        error = approvals.read(new.metadata.annotations).error
        if error:
            yield Violation(
                field=f"metadata.annotations[{approvals.APPROVALS_ANNOTATION}]", message=error
            )


def _spec(spec: api.NodeWrightSpec) -> Iterator[Violation]:
    for name, pkg in spec.packages.items():
        path = f"spec.packages[{name}]"
        if not re.fullmatch(api.PACKAGE_NAME_RE, name):
            yield Violation(
                field=path,
                message=f"package name {name!r} must be 1-43 lowercase letters, digits and '-', "
                "starting with a letter and not ending with '-'",
            )
        yield from _config(path, pkg)
        for dep, version in pkg.depends_on.items():
            if dep == name:
                yield Violation(field=f"{path}.dependsOn", message=f"{name} depends on itself")
            elif dep not in spec.packages:
                yield Violation(
                    field=f"{path}.dependsOn",
                    message=f"{dep!r} is not a package of this NodeWright",
                    reason="FieldValueNotFound",
                )
            elif spec.packages[dep].version != version:
                yield Violation(
                    field=f"{path}.dependsOn[{dep}]",
                    message=f"{dep} is at version {spec.packages[dep].version} in this "
                    f"NodeWright, not {version}",
                )
            elif _uninstalling(spec.packages[dep]) and not _uninstalling(pkg):
                yield Violation(
                    field=f"{path}.dependsOn[{dep}]",
                    message=f"{dep} is being uninstalled (uninstall.requested) while {name}, "
                    f"which depends on it, stays: uninstall {name} too, or remove the "
                    "dependency first",
                )
    if cycle := _find_cycle(spec.packages):
        yield Violation(
            field=f"spec.packages[{cycle[0]}].dependsOn",
            message="dependsOn has a cycle: " + " -> ".join(cycle),
        )
    yield from _selector("spec.nodeSelectors", spec.node_selectors)
    if spec.pod_non_interrupt_labels is not None:
        yield from _selector("spec.podNonInterruptLabels", spec.pod_non_interrupt_labels)
    if spec.drain.pod_selector is not None:
        yield from _selector("spec.drain.podSelector", spec.drain.pod_selector)
    for i, tol in enumerate(spec.additional_tolerations):
        if tol.key and not api.is_qualified_name(tol.key):
            yield Violation(
                field=f"spec.additionalTolerations[{i}].key",
                message=f"{tol.key!r} is not a valid taint key",
            )


def _config(path: str, pkg: api.Package) -> Iterator[Violation]:
    for key in pkg.config_map:
        if len(key) > 253 or not re.fullmatch(api.CONFIG_KEY_RE, key) or key in (".", ".."):
            yield Violation(
                field=f"{path}.configMap[{key}]",
                message=f"{key!r} must be a ConfigMap key: at most 253 letters, digits, '-', "
                "'_' or '.'",
            )
    for pattern in pkg.config_interrupts:
        if not any(fnmatch.fnmatchcase(key, pattern) for key in pkg.config_map):
            yield Violation(
                field=f"{path}.configInterrupts[{pattern}]",
                message=f"{pattern!r} matches no key of {path}.configMap",
                reason="FieldValueNotFound",
            )


def _find_cycle(packages: Mapping[str, api.Package]) -> list[str]:
    """One dependsOn cycle as [a, b, ..., a], or [] (self-loops are reported separately)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for dep in sorted(packages[name].depends_on):
            if dep == name or dep not in packages:
                continue
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[name] = 2
        return []

    for name in sorted(packages):
        if name not in state and (found := visit(name)):
            return found
    return []


def _selector(path: str, selector: api.LabelSelector) -> Iterator[Violation]:
    for key in selector.match_labels:
        if not api.is_qualified_name(key):
            yield Violation(
                field=f"{path}.matchLabels[{key}]",
                message=f"{key!r} is not a valid label key ([prefix/]name, name at most 63 "
                "characters)",
            )
    for i, req in enumerate(selector.match_expressions):
        if not api.is_qualified_name(req.key):
            yield Violation(
                field=f"{path}.matchExpressions[{i}].key",
                message=f"{req.key!r} is not a valid label key",
            )


def _policy_exists(name: str, existing: frozenset[str]) -> Iterator[Violation]:
    if name not in existing:
        yield Violation(
            field="spec.deploymentPolicy",
            message=f"DeploymentPolicy {name!r} does not exist; create it first",
            reason="FieldValueNotFound",
        )


def _present(inventory: PackageInventory, name: str) -> int:
    return sum(inventory.get(name, {}).values())


def _uninstalling(pkg: api.Package) -> bool:
    return pkg.uninstall is not None and pkg.uninstall.requested


def _uninstall_guards(
    old: api.NodeWrightSpec, new: api.NodeWrightSpec, inventory: PackageInventory
) -> Iterator[Violation]:
    for name, before in sorted(old.packages.items()):
        if before.uninstall is None or not before.uninstall.enabled:
            continue
        nodes = _present(inventory, name)
        if nodes == 0:
            continue
        after = new.packages.get(name)
        if after is None:
            yield Violation(
                field=f"spec.packages[{name}]",
                message=f"cannot remove package {name}: uninstall is enabled and it is still "
                f"present on {nodes} node(s). Set spec.packages[{name}].uninstall.requested: "
                "true, wait until status.packages no longer lists it on any node, then remove "
                "it (or set uninstall.enabled: false first to skip its uninstall steps)",
                reason="FieldValueForbidden",
            )
        elif api.parse_version(after.version) < api.parse_version(before.version):
            yield Violation(
                field=f"spec.packages[{name}].version",
                message=f"cannot downgrade {name} from {before.version} to {after.version} "
                f"before its uninstall completed: it is present on {nodes} node(s). Request "
                "the uninstall (uninstall.requested: true), wait until status.packages no "
                "longer lists it, then downgrade",
                reason="FieldValueForbidden",
            )


def _update_warnings(
    old: api.NodeWrightSpec, new: api.NodeWrightSpec, inventory: PackageInventory
) -> Iterator[str]:
    for name, before in sorted(old.packages.items()):
        after = new.packages.get(name)
        was_requested = before.uninstall is not None and before.uninstall.requested
        if after is None:
            if (before.uninstall is None or not before.uninstall.enabled) and _present(
                inventory, name
            ):
                yield (
                    f"spec.packages[{name}]: removed without uninstall; what it installed "
                    "stays on the nodes"
                )
        elif was_requested and (after.uninstall is None or not after.uninstall.requested):
            yield (
                f"spec.packages[{name}].uninstall.requested: cancelling an uninstall; nodes "
                "that already uninstalled it will install it again"
            )


def _spec_warnings(spec: api.NodeWrightSpec) -> Iterator[str]:
    if spec.sequencing == "all" and spec.runtime_required:
        yield (
            "spec.sequencing: all with runtimeRequired: one node that never completes holds back "
            "later NodeWrights on every node, and with them the runtime-required taint"
        )


# ---- DeploymentPolicy ---------------------------------------------------------------------


def review_deployment_policy(
    *,
    operation: Operation,
    old: api.DeploymentPolicy | None,
    new: api.DeploymentPolicy | None,
    referenced_by: Sequence[str],
) -> Verdict:
    """Admit a DeploymentPolicy CREATE, UPDATE or DELETE.

    Args:
        operation: the admission operation.
        old: the stored object (UPDATE, DELETE).
        new: the object as it would be stored (CREATE, UPDATE).
        referenced_by: names of the NodeWrights whose spec.deploymentPolicy names this policy
            (needed for DELETE only).
    """
    if operation == "DELETE":
        if not referenced_by:
            return Verdict()
        name = old.metadata.name if old is not None else "this DeploymentPolicy"
        return Verdict(
            violations=(
                Violation(
                    field="metadata.name",
                    message=f"DeploymentPolicy {name} is still referenced by spec.deploymentPolicy "
                    f"of NodeWright(s) {_named(sorted(referenced_by))}; change or delete them "
                    "first",
                    reason="FieldValueForbidden",
                ),
            )
        )
    if operation not in ("CREATE", "UPDATE") or new is None:
        return Verdict()
    if old is not None and old.spec == new.spec:
        return Verdict()
    violations: list[Violation] = []
    for i, comp in enumerate(new.spec.compartments):
        violations += _selector(f"spec.compartments[{i}].selector", comp.selector)
    for i, window in enumerate(new.spec.maintenance_windows):
        if not _known_zone(window.time_zone):
            violations.append(
                Violation(
                    field=f"spec.maintenanceWindows[{i}].timeZone",
                    message=f"{window.time_zone!r} is not a known IANA time zone",
                )
            )
    return Verdict(violations=tuple(violations))


def _known_zone(name: str) -> bool:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


# ---- AdmissionReview (admission.k8s.io/v1) ------------------------------------------------


class _Review(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    pass


class GroupVersionKind(_Review, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(_Review, frozen=True, kw_only=True):
    uid: str
    kind: GroupVersionKind
    operation: Operation
    name: str = ""
    # Raw: decoded later into the model of the resource the path names (b"" when absent).
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    old_object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    dry_run: bool = False


class StatusCause(_Review, frozen=True, kw_only=True):
    field: str
    message: str
    reason: str


class StatusDetails(_Review, frozen=True, kw_only=True):
    causes: list[StatusCause] = msgspec.field(default_factory=list)


class Status(_Review, frozen=True, kw_only=True):
    code: int
    reason: str
    message: str
    details: StatusDetails | None = None


class AdmissionResponse(_Review, frozen=True, kw_only=True):
    uid: str
    allowed: bool
    status: Status | None = None
    warnings: list[str] = msgspec.field(default_factory=list)


class AdmissionReviewRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """An AdmissionReview as the API server sends it."""

    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None


class AdmissionReviewResponse(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """An AdmissionReview as the API server expects it back (apiVersion and kind required)."""

    api_version: str = "admission.k8s.io/v1"
    kind: str = "AdmissionReview"
    response: AdmissionResponse


def respond(uid: str, verdict: Verdict) -> AdmissionReviewResponse:
    """The AdmissionReview answering request ``uid`` with ``verdict``."""
    status = None
    if not verdict.allowed:
        status = Status(
            code=verdict.code,
            reason="Forbidden" if verdict.code == 403 else "Invalid",
            message=verdict.message,
            details=StatusDetails(
                causes=[
                    StatusCause(field=v.field, message=v.message, reason=v.reason)
                    for v in verdict.violations
                ]
            ),
        )
    return AdmissionReviewResponse(
        response=AdmissionResponse(
            uid=uid, allowed=verdict.allowed, status=status, warnings=list(verdict.warnings)
        )
    )


def decode_object(raw: msgspec.Raw, kind: type[api.Resource]) -> api.Resource | None:
    """The request's object or oldObject as a model (None when absent or JSON null)."""
    if bytes(raw) in (b"", b"null"):
        return None
    return api.decode(bytes(raw), kind)


def denial(uid: str, field: str, message: str) -> AdmissionReviewResponse:
    """A denial not produced by a review function (undecodable object, failed lookup)."""
    return respond(uid, Verdict(violations=(Violation(field=field, message=message),)))
