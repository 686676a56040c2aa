"""The NodeWright and DeploymentPolicy custom resources: the one source of truth for their shape.

Every CR field is declared once here as a frozen msgspec Struct. The structs decode and encode
the CR JSON (camelCase on the wire, defaults omitted), and ``nodewright.crdgen`` generates the
CRD schemas from them: types, ranges and patterns from the annotations, descriptions from the
class and attribute docstrings (that text is what ``kubectl explain`` prints), and CEL rules
from the :class:`Rule` objects attached to classes (``validations``) and fields (``cel(...)``).
A test fails when the committed CRDs differ from what the models generate.

Not this module's job: checks that need other objects or are too expensive for CEL (dependsOn
cycles, map-key syntax, a referenced DeploymentPolicy existing, uninstall progress) live in
``services.validator.admission``; what the fields *do* at runtime belongs to the services that
read them. This module does no I/O (import-linter forbids it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar, Final, Generic, Literal, TypeVar

import msgspec

GROUP: Final = "nodewright.nvidia.com"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "nodewright.nvidia.com/v1alpha1"
NODEWRIGHT_PLURAL: Final = "nodewrights"
DEPLOYMENT_POLICY_PLURAL: Final = "deploymentpolicies"

# Lifecycle switches are annotations, not spec fields: toggling them must not bump
# metadata.generation (which would look like a new desired state and reset batch state).
PAUSE_ANNOTATION: Final = f"{GROUP}/pause"
DISABLE_ANNOTATION: Final = f"{GROUP}/disable"


# ---- schema metadata ---------------------------------------------------------------------


class Rule(msgspec.Struct, frozen=True, kw_only=True):
    """A CEL ``x-kubernetes-validations`` entry attached to a model class or field."""

    rule: str
    message: str
    field_path: str = ""
    """Relative JSON path (``.version``) the API server reports the error at; default: here."""
    reason: str = ""
    """FieldValueInvalid (default), FieldValueForbidden, FieldValueRequired, ..."""
    message_expression: str = ""


def cel(*rules: Rule) -> msgspec.Meta:
    """Attach CEL rules to a field: ``Annotated[str, cel(Rule(...))]``."""
    return msgspec.Meta(extra={"cel": rules})


def _plain(pattern: str, *, max_length: int, min_length: int = 0) -> msgspec.Meta:
    # An OpenAPI `pattern`: its error names the field and prints the regex. Used where a CEL
    # `matches` would cost too much (deeply nested, high-cardinality strings).
    return msgspec.Meta(pattern=pattern, max_length=max_length, min_length=min_length or None)


def _pattern(pattern: str, message: str, *, max_length: int, min_length: int = 0) -> msgspec.Meta:
    # The CRD gets a CEL `matches` with a readable message instead of an OpenAPI `pattern`
    # (whose error only prints the regex); msgspec checks the same pattern on decode.
    return msgspec.Meta(
        pattern=pattern,
        max_length=max_length,
        min_length=min_length or None,
        extra={"pattern_message": message},
    )


def _optional(pattern: str) -> str:
    """``pattern`` (anchored with ^...$) or the empty string."""
    return f"^({pattern[1:-1]})?$"


LIST_MAP: Final = "list_map_keys"
LIST_SET: Final = "list_set"

# Regexes shared with the admission checks. All are valid in both Python `re` and RE2.
DNS_LABEL_RE: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_RE: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
PACKAGE_NAME_RE: Final = r"^[a-z]([-a-z0-9]{0,41}[a-z0-9])?$"
# Semantic version, 1 to 3 numeric parts (missing parts count as 0), optional 'v' prefix and
# pre-release; no leading zeros (like golang.org/x/mod/semver, which the reference used). No
# `+build` suffix: the version is the image tag and tags cannot contain '+'.
VERSION_RE: Final = (
    r"^v?(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*)){0,2}(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
_DOMAIN = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
_PATH_COMPONENT = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
# [registry[:port]/]path[/path...] -- no tag, no digest.
IMAGE_RE: Final = rf"^({_DOMAIN}(:[0-9]+)?/)?{_PATH_COMPONENT}(/{_PATH_COMPONENT})*$"
IMAGE_WITH_TAG_RE: Final = r":[^/]*$"
DIGEST_RE: Final = r"^(sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128})$"
LABEL_NAME_RE: Final = r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
LABEL_VALUE_RE: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
CONFIG_KEY_RE: Final = r"^[-._a-zA-Z0-9]+$"
ENV_NAME_RE: Final = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
SERVICE_RE: Final = r"^[A-Za-z0-9][A-Za-z0-9:_.@-]*$"
CLOCK_RE: Final = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
TIME_ZONE_RE: Final = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$"
REASON_RE: Final = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
CONDITION_TYPE_RE: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
# Label keys and toleration keys: [prefix/]name. The prefix part is checked loosely here and
# exactly by `is_qualified_name` (a regex cannot bound both part lengths).
QUALIFIED_NAME_RE: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
)


def is_qualified_name(key: str) -> bool:
    """A valid label key: an optional DNS-subdomain prefix (<=253) and a name (<=63)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not 0 < len(prefix) <= 253 or not re.fullmatch(DNS_SUBDOMAIN_RE, prefix)):
        return False
    return 0 < len(name) <= 63 and re.fullmatch(LABEL_NAME_RE, name) is not None


def parse_version(version: str) -> tuple[tuple[int, int, int], tuple[tuple[int, int | str], ...]]:
    """Sort key for :data:`VERSION_RE` versions, in semver precedence order.

    Missing minor/patch parts count as 0; a pre-release sorts before its release; numeric
    pre-release identifiers sort before alphanumeric ones.
    """
    if not re.fullmatch(VERSION_RE, version):
        raise ValueError(f"not a version: {version!r}")
    core, _, pre = version.removeprefix("v").partition("-")
    parts = [int(p) for p in core.split(".")] + [0, 0]
    release = (parts[0], parts[1], parts[2])
    if not pre:
        # Any release sorts after every pre-release of the same core version.
        return release, ((2, 0),)
    ids: list[tuple[int, int | str]] = [
        (0, int(p)) if p.isdigit() else (1, p) for p in pre.split(".")
    ]
    return release, tuple(ids)


# ---- field types ----------------------------------------------------------------------------

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
Percent = Annotated[int, msgspec.Meta(ge=1, le=100)]
Seconds = Annotated[int, msgspec.Meta(ge=1, le=604800)]
LabelValue = Annotated[str, msgspec.Meta(max_length=63, pattern=LABEL_VALUE_RE)]
Message = Annotated[str, msgspec.Meta(max_length=1024)]
Reason = Annotated[
    str,
    _pattern(
        REASON_RE, "must be a CamelCase reason such as DrainBlocked", max_length=128, min_length=1
    ),
]
# The Kubernetes quantity syntax (as in generated CRDs), e.g. 100m, 1.5Gi, 2e3.
QUANTITY_RE: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = Annotated[
    int | Annotated[str, msgspec.Meta(max_length=64, pattern=QUANTITY_RE)],
    cel(
        Rule(
            rule="isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))",
            message="must be a positive Kubernetes quantity such as 500m, 2 or 1Gi",
        )
    ),
]
PolicyName = Annotated[
    str,
    _pattern(
        DNS_SUBDOMAIN_RE,
        "must be the name of a DeploymentPolicy (lowercase DNS subdomain)",
        max_length=253,
        min_length=1,
    ),
]
PackageVersion = Annotated[
    str,
    _pattern(
        VERSION_RE,
        "must be a semantic version such as 1.2.3, v1.2 or 2024.7.1-rc.1 (no leading zeros, "
        "no +build suffix: the version is also the image tag)",
        max_length=64,
        min_length=1,
    ),
]


SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
TolerationOperator = Literal["Exists", "Equal"]
TaintEffect = Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"]
InterruptType = Literal["service", "restartAllServices", "reboot", "noop"]
UnmanagedPodPolicy = Literal["Block", "Evict", "Delete"]
Sequencing = Literal["node", "all"]
Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
NodeState = Literal["Waiting", "InProgress", "Complete", "Failed", "Blocked", "Unknown"]
RolloutState = Literal[
    "Unknown",
    "Waiting",
    "InProgress",
    "Complete",
    "Failed",
    "Blocked",
    "Stopped",
    "Paused",
    "Disabled",
]


class _Model(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Base of every CR part: immutable, camelCase JSON, defaults left out when encoding.

    Unknown fields are ignored on decode (the API server prunes them anyway), so newer CRs
    still decode with older code.
    """

    validations: ClassVar[tuple[Rule, ...]] = ()


# ---- shared Kubernetes shapes -----------------------------------------------------------


class LabelSelectorRequirement(_Model, frozen=True, kw_only=True):
    """One label-selector term: a key, an operator, and the values it applies to."""

    validations = (
        Rule(
            rule="self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 "
            ": !has(self.values) || size(self.values) == 0",
            message="values must be non-empty for operator In or NotIn and empty for Exists or "
            "DoesNotExist",
            field_path=".values",
        ),
    )

    key: Annotated[
        str,
        _plain(QUALIFIED_NAME_RE, max_length=317, min_length=1),
    ]
    """The label key the selector applies to."""
    operator: SelectorOperator
    """How the key relates to the values: In, NotIn, Exists or DoesNotExist."""
    values: Annotated[list[LabelValue], msgspec.Meta(max_length=64, extra={LIST_SET: True})] = (
        msgspec.field(default_factory=list)
    )
    """Label values; non-empty for In and NotIn, empty for Exists and DoesNotExist."""


class LabelSelector(_Model, frozen=True, kw_only=True):
    """A standard Kubernetes label selector. The terms are ANDed."""

    match_labels: Annotated[dict[str, LabelValue], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=dict
    )
    """Label key -> value pairs that must all be present."""
    match_expressions: Annotated[list[LabelSelectorRequirement], msgspec.Meta(max_length=32)] = (
        msgspec.field(default_factory=list)
    )
    """Set-based requirements that must all hold."""

    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class Toleration(_Model, frozen=True, kw_only=True):
    """A pod toleration (core/v1 Toleration) added to every pod NodeWright runs on a node."""

    validations = (
        Rule(
            rule="self.operator != 'Exists' || !has(self.value) || size(self.value) == 0",
            message="value must be empty when operator is Exists",
            field_path=".value",
        ),
        Rule(
            rule="(has(self.key) && size(self.key) > 0) || self.operator == 'Exists'",
            message="operator must be Exists when key is empty (tolerate every taint)",
            field_path=".operator",
        ),
        Rule(
            rule="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="tolerationSeconds is only allowed with effect NoExecute",
            field_path=".tolerationSeconds",
        ),
    )

    key: Annotated[
        str,
        _plain(_optional(QUALIFIED_NAME_RE), max_length=317),
    ] = ""
    """The taint key; empty with operator Exists tolerates every taint."""
    operator: TolerationOperator = "Equal"
    """Equal (key and value must match) or Exists (any value)."""
    value: LabelValue = ""
    """The taint value for operator Equal."""
    effect: TaintEffect = ""
    """The taint effect to tolerate; empty tolerates every effect."""
    toleration_seconds: int | None = None
    """For NoExecute: how long the pod stays bound after the taint appears (default: forever)."""


class ObjectKeySelector(_Model, frozen=True, kw_only=True):
    """Selects a key of a ConfigMap or Secret in the namespace NodeWright runs its pods in."""

    name: Annotated[
        str,
        _plain(DNS_SUBDOMAIN_RE, max_length=253, min_length=1),
    ]
    """Name of the ConfigMap or Secret."""
    key: Annotated[
        str,
        _plain(CONFIG_KEY_RE, max_length=253, min_length=1),
    ]
    """The key to read."""
    optional: bool = False
    """When true, a missing object or key leaves the variable unset instead of failing."""


class ObjectFieldSelector(_Model, frozen=True, kw_only=True):
    """Selects a field of the pod (core/v1 ObjectFieldSelector), e.g. spec.nodeName."""

    field_path: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    """Path of the field, e.g. spec.nodeName or metadata.annotations['example.com/x']."""
    api_version: Annotated[str, msgspec.Meta(max_length=64)] = "v1"
    """API version the field path is written in."""


class ResourceFieldSelector(_Model, frozen=True, kw_only=True):
    """Selects a resource limit or request of the container (core/v1 ResourceFieldSelector)."""

    resource: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    """The resource, e.g. limits.cpu or requests.memory."""
    container_name: Annotated[str, msgspec.Meta(max_length=63)] = ""
    """Container to read from; empty means the stage container."""
    divisor: Quantity | None = None
    """Unit to express the value in, e.g. 1Mi; default 1."""


class EnvVarSource(_Model, frozen=True, kw_only=True):
    """Where a variable's value comes from: exactly one of the four references."""

    validations = (
        Rule(
            rule="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
            "has(self.resourceFieldRef)].filter(x, x).size() == 1",
            message="set exactly one of secretKeyRef, configMapKeyRef, fieldRef or "
            "resourceFieldRef",
        ),
    )

    secret_key_ref: ObjectKeySelector | None = None
    """A key of a Secret in NodeWright's namespace (how packages receive credentials)."""
    config_map_key_ref: ObjectKeySelector | None = None
    """A key of a ConfigMap in NodeWright's namespace."""
    field_ref: ObjectFieldSelector | None = None
    """A field of the stage pod, e.g. spec.nodeName."""
    resource_field_ref: ResourceFieldSelector | None = None
    """A resource limit or request of the stage container."""


class EnvVar(_Model, frozen=True, kw_only=True):
    """An environment variable for the package's stage containers (core/v1 EnvVar)."""

    validations = (
        Rule(
            rule="!(has(self.value) && has(self.valueFrom))",
            message="set value or valueFrom, not both",
            field_path=".valueFrom",
        ),
    )

    name: Annotated[
        str,
        _plain(ENV_NAME_RE, max_length=253, min_length=1),
    ]
    """The variable name."""
    value: Annotated[str, msgspec.Meta(max_length=32768)] | None = None
    """A literal value."""
    value_from: EnvVarSource | None = None
    """A value read from a Secret, ConfigMap, pod field or resource."""


# ---- NodeWright ---------------------------------------------------------------------------


class Budget(_Model, frozen=True, kw_only=True):
    """How many nodes may be disrupted at the same time: exactly one of percent or count.

    A percent is of the nodes in scope, rounded down, but never below 1 node.
    """

    validations = (
        Rule(
            rule="has(self.percent) != has(self.count)",
            message="set exactly one of percent or count",
        ),
    )

    percent: Percent | None = None
    """Percent (1-100) of the nodes in scope; rounded down, at least 1 node."""
    count: Positive | None = None
    """A fixed number of nodes (>= 1)."""


class Interrupt(_Model, frozen=True, kw_only=True):
    """What the node needs after the package's config stage: a service restart or a reboot."""

    validations = (
        Rule(
            rule="self.type == 'service' ? has(self.services) && size(self.services) > 0 "
            ": !has(self.services) || size(self.services) == 0",
            message="services must list the systemd units to restart for type service, and "
            "must be empty for other types",
            field_path=".services",
        ),
    )

    type: InterruptType
    """service: restart the listed systemd units; restartAllServices: restart every service;
    reboot: reboot the node; noop: no action, but the node is still cordoned and drained."""
    services: Annotated[
        list[
            Annotated[
                str,
                _plain(SERVICE_RE, max_length=256, min_length=1),
            ]
        ],
        msgspec.Meta(max_length=64, extra={LIST_SET: True}),
    ] = msgspec.field(default_factory=list)
    """systemd units restarted by a service interrupt, in order; required for type service."""


class ResourceList(_Model, frozen=True, kw_only=True):
    """CPU and memory quantities."""

    cpu: Quantity | None = None
    """CPU, e.g. 500m or 2."""
    memory: Quantity | None = None
    """Memory, e.g. 256Mi or 1Gi."""


class Resources(_Model, frozen=True, kw_only=True):
    """Requests and limits for the package's stage containers (unset: the namespace defaults)."""

    validations = (
        Rule(
            rule="!has(self.requests.cpu) || !has(self.limits.cpu) || "
            "!isQuantity(string(self.requests.cpu)) || !isQuantity(string(self.limits.cpu)) || "
            "quantity(string(self.limits.cpu)).compareTo(quantity(string(self.requests.cpu))) >= 0",
            message="limits.cpu must be at least requests.cpu",
            field_path=".limits.cpu",
        ),
        Rule(
            rule="!has(self.requests.memory) || !has(self.limits.memory) || "
            "!isQuantity(string(self.requests.memory)) || "
            "!isQuantity(string(self.limits.memory)) || "
            "quantity(string(self.limits.memory)).compareTo("
            "quantity(string(self.requests.memory))) >= 0",
            message="limits.memory must be at least requests.memory",
            field_path=".limits.memory",
        ),
    )

    requests: ResourceList = msgspec.field(default_factory=ResourceList)
    """Guaranteed resources."""
    limits: ResourceList = msgspec.field(default_factory=ResourceList)
    """Upper bounds; each must be at least the matching request."""


class Uninstall(_Model, frozen=True, kw_only=True):
    """Whether the package can be uninstalled, and whether to uninstall it now."""

    validations = (
        Rule(
            rule="!self.requested || self.enabled",
            message="requested: true needs enabled: true (the package must declare uninstall "
            "support)",
            field_path=".requested",
        ),
    )

    enabled: bool = False
    """The package has uninstall steps. NodeWright then runs them before the package may be
    removed from the spec, downgraded, or the NodeWright deleted, and refuses those changes
    until the uninstall finished on every node."""
    requested: bool = False
    """Uninstall the package from every node now (needs enabled). Setting it back to false
    before the uninstall reached its interrupt cancels it and reinstalls."""


class Package(_Model, frozen=True, kw_only=True):
    """One versioned host package. Its name is its key in spec.packages."""

    validations = (
        Rule(
            rule="!has(oldSelf.uninstall) || !oldSelf.uninstall.requested || "
            "!has(self.uninstall) || !self.uninstall.requested || self.version == oldSelf.version",
            message="version cannot change while uninstall.requested is true: the uninstall "
            "targets the installed version; let it finish or cancel it first",
            field_path=".version",
        ),
    )

    version: PackageVersion
    """Semantic version of the package (optional 'v' prefix; 1.2 means 1.2.0). It is also the
    image tag. A higher version upgrades nodes, a lower one downgrades them."""
    image: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=255,
            pattern=IMAGE_RE,
            extra={
                "pattern_in_cel": True,
                "cel": (
                    Rule(
                        rule=f"!self.matches(r'{IMAGE_WITH_TAG_RE}')",
                        message="image must not include a tag: the tag is the package version",
                    ),
                    Rule(
                        rule="!self.contains('@')",
                        message="image must not include a digest: set digest instead",
                    ),
                    Rule(
                        rule=f"self.matches(r'{IMAGE_WITH_TAG_RE}') || self.contains('@') || "
                        f"self.matches(r'{IMAGE_RE}')",
                        message="image must be an image reference without tag, such as "
                        "ghcr.io/org/name or registry.local:5000/org/name",
                    ),
                ),
            },
        ),
    ]
    """Image repository of the package, without tag or digest: [registry[:port]/]path. The
    image pulled is image:version, or image@digest when digest is set."""
    digest: Annotated[
        str,
        _pattern(
            DIGEST_RE,
            "digest must be sha256:<64 hex digits> or sha512:<128 hex digits>",
            max_length=135,
        ),
    ] = ""
    """Optional content pin. When set, the image is pulled as image@digest instead of
    image:version (version still names the release for upgrade and downgrade decisions)."""
    interrupt: Interrupt | None = None
    """What the node needs after the package's config stage (restart services, reboot).
    Interrupts of packages due on the same node are merged: reboot wins, then
    restartAllServices, then the union of services."""
    config_map: Annotated[
        dict[str, Annotated[str, msgspec.Meta(max_length=1048576)]],
        msgspec.Meta(max_length=256),
    ] = msgspec.field(default_factory=dict)
    """Files given to the package: file name -> content. Changing content re-runs the
    package's config stage (and interrupt) on every node."""
    config_interrupts: Annotated[dict[str, Interrupt], msgspec.Meta(max_length=256)] = (
        msgspec.field(default_factory=dict)
    )
    """Interrupts for configuration changes: configMap key or glob (*, ?, [..]) -> interrupt.
    When only configMap keys change, the interrupt is taken from the patterns matching the
    changed keys instead of the package interrupt. Each pattern must match a configMap key."""
    env: Annotated[
        list[EnvVar],
        msgspec.Meta(max_length=128, extra={LIST_MAP: ("name",)}),
    ] = msgspec.field(default_factory=list)
    """Environment variables for the package's stage containers; valueFrom.secretKeyRef passes
    a Secret from NodeWright's namespace without putting it in the CR."""
    depends_on: Annotated[dict[str, PackageVersion], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=dict
    )
    """Packages that must be complete on a node before this one starts there: package name ->
    its version in this NodeWright. Cycles are rejected."""
    resources: Resources | None = None
    """CPU and memory requests and limits for the package's stage containers."""
    graceful_shutdown_seconds: Annotated[int, msgspec.Meta(ge=0, le=3600)] | None = None
    """Seconds a stage container gets to stop after SIGTERM (pod terminationGracePeriodSeconds);
    unset: the Kubernetes default, 30."""
    stage_timeout_seconds: Seconds | None = None
    """Overrides spec.stageTimeoutSeconds for this package's stages."""
    uninstall: Uninstall | None = None
    """Uninstall support and an uninstall request."""


class DrainOptions(_Model, frozen=True, kw_only=True):
    """How NodeWright empties a node before working on it (in the spirit of kubectl drain).

    Before a node's first package stage of a rollout it is cordoned (no new pods land), then
    NodeWright waits for every pod matching spec.podNonInterruptLabels to finish, then drains
    it; the node is uncordoned when the NodeWright is complete on it.
    """

    only_for_interrupts: bool = False
    """false (default): every node is cordoned and drained before its packages run. true: only
    nodes where a package about to run will run an interrupt are cordoned and drained: its
    interrupt for an install, upgrade or uninstall; for a configuration change, the
    configInterrupts matching the keys that changed. Other nodes are changed while their
    workloads keep running."""
    timeout_seconds: Annotated[int, msgspec.Meta(ge=0, le=604800)] = 3600
    """Seconds the drain may take before the node is marked Failed with reason DrainTimeout;
    0 waits forever. Time spent waiting for podNonInterruptLabels pods does not count."""
    grace_period_seconds: Annotated[int, msgspec.Meta(ge=0, le=86400)] | None = None
    """Termination grace period given to evicted pods; unset: each pod's own."""
    delete_empty_dir_data: bool = False
    """Evict pods that use emptyDir volumes (their data is lost). When false, such a pod blocks
    the drain and the node reports DrainBlocked."""
    ignore_daemon_sets: bool = True
    """Leave DaemonSet pods running (they would be recreated on the node anyway). When false,
    a DaemonSet pod blocks the drain."""
    unmanaged_pods: UnmanagedPodPolicy = "Block"
    """Pods without a controller are gone for good once removed. Block: they block the drain
    (node reports DrainBlocked); Evict: evict them through the Eviction API (PDBs respected);
    Delete: delete them directly (PDBs bypassed)."""
    pod_selector: LabelSelector | None = None
    """Only pods matching this selector are drained; unset drains every pod (except DaemonSet
    pods, mirror pods and NodeWright's own pods)."""
    protected_pods_timeout_seconds: Annotated[int, msgspec.Meta(ge=1, le=2592000)] | None = None
    """Seconds a cordoned node may wait for pods matching spec.podNonInterruptLabels to finish
    before it is marked Failed with reason ProtectedPodTimeout naming them; unset (default)
    waits as long as they run. Retry the node (nodewright node retry) to wait again."""
    pre_pull_images: bool = False
    """true: the images of the packages about to run on a node are pulled onto it (by a pod
    of NodeWright's that runs nothing else) from the moment it is admitted, while it is
    cordoned and waits for its protected pods, and the drain starts only once they are there
    (reason ImagesPulling meanwhile). The evicted workloads' downtime then leaves out the
    pull, and an image that does not pull (a wrong tag, a missing pull secret) fails the node
    with ImagePullFailed before anything is evicted. false (default): each stage pod pulls
    its image after the drain."""


class DeploymentPolicyOptions(_Model, frozen=True, kw_only=True):
    """Per-NodeWright overrides of the referenced DeploymentPolicy; unset inherits the policy."""

    reset_batch_state_on_completion: bool | None = None
    """Overrides the policy's resetBatchStateOnCompletion."""
    reset_batch_state_on_version_change: bool | None = None
    """Overrides the policy's resetBatchStateOnVersionChange."""


class NodeWrightSpec(_Model, frozen=True, kw_only=True):
    """Desired host state: which nodes get which packages, and how fast."""

    validations = (
        Rule(
            rule="!(has(self.deploymentPolicy) && has(self.interruptionBudget))",
            message="set deploymentPolicy or interruptionBudget, not both (a policy has its own "
            "budgets)",
            field_path=".interruptionBudget",
        ),
        Rule(
            rule="!self.autoTaintNewNodes || self.runtimeRequired",
            message="autoTaintNewNodes needs runtimeRequired: true",
            field_path=".autoTaintNewNodes",
        ),
        Rule(
            rule="!has(self.deploymentPolicyOptions) || has(self.deploymentPolicy)",
            message="deploymentPolicyOptions needs deploymentPolicy",
            field_path=".deploymentPolicyOptions",
        ),
        Rule(
            rule="self.packages.all(p, !has(self.packages[p].dependsOn) || "
            "self.packages[p].dependsOn.all(d, d in self.packages && "
            "self.packages[d].version == self.packages[p].dependsOn[d]))",
            message="every dependsOn entry must name another package of spec.packages with the "
            "version given there",
            field_path=".packages",
        ),
    )

    packages: Annotated[dict[str, Package], msgspec.Meta(min_length=1, max_length=64)]
    """The packages: name -> package. Names are 1-43 lowercase letters, digits and '-',
    starting with a letter. Packages without dependsOn between them run in parallel."""
    node_selectors: LabelSelector = msgspec.field(default_factory=LabelSelector)
    """The nodes to manage; empty selects every node."""
    interruption_budget: Budget | None = None
    """Without deploymentPolicy: the most nodes this NodeWright works on at the same time (a
    hard cap). Unset (and no deploymentPolicy) means one node at a time."""
    deployment_policy: PolicyName | None = None
    """Name of a DeploymentPolicy that sets batches, budgets, failure gates and maintenance
    windows. It must exist; it cannot be deleted while referenced."""
    deployment_policy_options: DeploymentPolicyOptions | None = None
    """Overrides of the referenced DeploymentPolicy for this NodeWright."""
    pod_non_interrupt_labels: LabelSelector | None = None
    """Pods matching this selector must not be interrupted: a node running such a pod is
    cordoned (so no new work lands) but not drained or changed until the pod finishes (it
    waits, without timeout, and says which pods it waits for). Unset or empty protects no
    pod (unlike an empty selector elsewhere, which matches everything)."""
    additional_tolerations: Annotated[list[Toleration], msgspec.Meta(max_length=64)] = (
        msgspec.field(default_factory=list)
    )
    """Tolerations added to every pod NodeWright runs on a node. Nodes with taints not tolerated
    here are Blocked (reason TaintNotTolerated)."""
    priority: Annotated[int, msgspec.Meta(ge=1, le=1000000)] = 200
    """Order among NodeWrights: lower runs first on a node; ties break by name."""
    sequencing: Sequencing = "node"
    """How this NodeWright gates higher-priority-number NodeWrights. node: a node may continue
    with the next NodeWright once this one is complete on it. all: the next NodeWright waits
    until this one is complete on every node."""
    runtime_required: bool = False
    """Nodes carry the runtime-required taint until every runtimeRequired NodeWright is complete
    on them, so workloads only land on finished nodes."""
    auto_taint_new_nodes: bool = False
    """With runtimeRequired: taint nodes NodeWright has never seen, for clusters whose node
    provisioning cannot add the taint itself."""
    reapply_on_reboot: bool = False
    """Run every package again on a node that rebooted since its packages completed, other than
    by NodeWright's own interrupt: for read-only or ephemeral OS images whose host changes do
    not survive a reboot. The node starts over (as after nodewright node reset), within the
    budget, with an Event NodeRebooted naming the old and new boot IDs."""
    drain: DrainOptions = msgspec.field(default_factory=DrainOptions)
    """Cordon and drain behaviour."""
    stage_timeout_seconds: Seconds = 1800
    """Seconds one package stage (apply, config, interrupt including the reboot, ...) may take
    on a node before it fails with reason StageTimeout; packages can override it."""


# ---- status ---------------------------------------------------------------------------------


class Condition(_Model, frozen=True, kw_only=True):
    """A standard status condition (metav1.Condition)."""

    type: Annotated[
        str,
        _pattern(CONDITION_TYPE_RE, "type must be a condition type", max_length=316, min_length=1),
    ]
    """Condition type, e.g. Ready."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    last_transition_time: datetime
    """When status last changed."""
    reason: Annotated[
        str,
        _pattern(
            REASON_RE,
            "reason must be CamelCase, e.g. NodesConverged",
            max_length=1024,
            min_length=1,
        ),
    ]
    """Machine-readable CamelCase reason for the last transition."""
    message: Annotated[str, msgspec.Meta(max_length=32768)] = ""
    """Human-readable detail; node lists in it are truncated."""
    observed_generation: NonNegative | None = None
    """metadata.generation the condition was computed from. Unset rather than 0 when unknown:
    kubectl wait ignores a condition whose observedGeneration is below the generation."""


class NodeCounts(_Model, frozen=True, kw_only=True):
    """Targeted nodes by state. Every target node is in exactly one state."""

    target: NonNegative = 0
    """Nodes matching spec.nodeSelectors."""
    complete: NonNegative = 0
    """Nodes where every package is at the spec version and done."""
    in_progress: NonNegative = 0
    """Nodes being cordoned, drained, or running package stages."""
    failed: NonNegative = 0
    """Nodes where a stage or the drain failed or timed out (they are retried)."""
    waiting: NonNegative = 0
    """Nodes waiting for their batch, a maintenance window, priority ordering or protected pods."""
    blocked: NonNegative = 0
    """Nodes NodeWright cannot work on: ignored, untolerated taint, or a missing policy."""


class PackageStatus(_Model, frozen=True, kw_only=True):
    """Where one package version is present, summed over nodes (bounded: no node names)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=43)]
    """Package name."""
    version: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    """Package version."""
    present_nodes: NonNegative = 0
    """Nodes where this version is installed or being installed, upgraded or uninstalled.
    0 for a version with uninstall.enabled means its uninstall has completed everywhere."""
    complete_nodes: NonNegative = 0
    """Nodes where this version is fully applied."""
    in_progress_nodes: NonNegative = 0
    """Nodes running a stage of this version."""
    failed_nodes: NonNegative = 0
    """Nodes where a stage of this version failed."""
    uninstalling_nodes: NonNegative = 0
    """Nodes where this version is being uninstalled."""


class BatchState(_Model, frozen=True, kw_only=True):
    """Rollout progress of one compartment; persisted here so a restart resumes the rollout."""

    current_batch: Positive = 1
    """1-based number of the batch in flight (or next)."""
    batch_size: NonNegative = 0
    """Nodes in the current batch."""
    batch_succeeded_nodes: NonNegative = 0
    """Nodes of the current batch that completed."""
    batch_failed_nodes: NonNegative = 0
    """Nodes of the current batch that failed (or were blocked, if the policy counts those)."""
    total_succeeded_nodes: NonNegative = 0
    """Nodes of the compartment that completed in finished batches."""
    total_failed_nodes: NonNegative = 0
    """Nodes of the compartment that failed in finished batches."""
    consecutive_failed_batches: NonNegative = 0
    """Finished batches in a row below batchSuccessPercent."""
    last_batch_failed: bool = False
    """The previous batch was below batchSuccessPercent (the next one may shrink)."""
    stopped: bool = False
    """The compartment starts no new nodes until its batch state is reset."""
    stop_reason: Annotated[
        str,
        _pattern(
            _optional(REASON_RE),
            "stopReason must be CamelCase, e.g. FailedBatchesLimit",
            max_length=128,
        ),
    ] = ""
    """Machine-readable reason the compartment stopped, e.g. FailedBatchesLimit."""
    stop_message: Message = ""
    """Why the compartment stopped, for humans."""


class CompartmentStatus(_Model, frozen=True, kw_only=True):
    """Progress of one compartment of the rollout (the policy's default is named __default__)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
    """Compartment name from the DeploymentPolicy, or __default__."""
    matched_nodes: NonNegative = 0
    """Target nodes assigned to this compartment."""
    budget_nodes: NonNegative = 0
    """The compartment's budget in nodes: the most it disrupts at once."""
    in_progress_nodes: NonNegative = 0
    """Nodes of this compartment in progress."""
    complete_nodes: NonNegative = 0
    """Nodes of this compartment complete."""
    failed_nodes: NonNegative = 0
    """Nodes of this compartment failed."""
    progress_percent: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0
    """completeNodes * 100 / matchedNodes, rounded down."""
    batch: BatchState = msgspec.field(default_factory=BatchState)
    """Batch state of the compartment."""
    waiting_reason: Annotated[
        str,
        _pattern(
            _optional(REASON_RE),
            "waitingReason must be CamelCase, e.g. WaitingForWindow",
            max_length=128,
        ),
    ] = ""
    """Why the compartment starts no node although nodes wait for it, e.g. WaitingForWindow,
    Paused, WaitingForPriority, BudgetExhausted, ClusterBudgetExhausted,
    SharedBudgetExhausted; empty while it is not held back (waiting for the batch in flight
    is no reason). A stop is batch.stopped."""
    waiting_message: Message = ""
    """The waiting reason in words, with how many nodes wait and one of them."""


class NodeDetail(_Model, frozen=True, kw_only=True):
    """Why one node is not complete (status keeps only a bounded sample of these)."""

    node: Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
    """Node name."""
    state: NodeState
    """The node's state for this NodeWright."""
    reason: Reason
    """Machine-readable reason, e.g. DrainBlocked, StageFailed, StageTimeout, WaitingForWindow."""
    message: Message = ""
    """Detail for humans, e.g. the pod blocking the drain."""
    package: Annotated[str, msgspec.Meta(max_length=43)] = ""
    """The package concerned, if any."""
    since: datetime | None = None
    """When the node entered this state."""


MAX_NODE_DETAILS: Final = 20


class NodeWrightStatus(_Model, frozen=True, kw_only=True):
    """Observed state. Bounded in size whatever the node count: per-node state lives on the
    Node objects (annotations <service>.nodewright.nvidia.com/<name>, see docs/api.md)."""

    validations = (
        Rule(
            rule="self.observedGeneration >= oldSelf.observedGeneration",
            message="observedGeneration must not decrease (a stale status writer)",
            field_path=".observedGeneration",
        ),
    )

    observed_generation: NonNegative = 0
    """metadata.generation this status was computed from."""
    state: RolloutState = "Unknown"
    """Summary: Complete when every target node is; InProgress while any node is; otherwise
    the state shared by the remaining nodes. Stopped: a compartment hit its failure gate.
    Paused/Disabled: set by the pause/disable annotations."""
    conditions: Annotated[
        list[Condition], msgspec.Meta(max_length=32, extra={LIST_MAP: ("type",)})
    ] = msgspec.field(default_factory=list)
    """Standard conditions; Ready is True when every target node is complete for the current
    generation (kubectl wait --for=condition=Ready)."""
    node_counts: NodeCounts = msgspec.field(default_factory=NodeCounts)
    """Target nodes by state."""
    complete_nodes: Annotated[str, msgspec.Meta(max_length=32)] = "0/0"
    """Complete/target nodes, e.g. 3/5 (printer column)."""
    package_list: Annotated[str, msgspec.Meta(max_length=8192)] = ""
    """Spec packages as name:version, sorted and comma-separated (printer column)."""
    packages: Annotated[
        list[PackageStatus], msgspec.Meta(max_length=256, extra={LIST_MAP: ("name", "version")})
    ] = msgspec.field(default_factory=list)
    """Every package version present on any node (spec versions and ones being replaced or
    uninstalled), with node counts."""
    compartments: Annotated[
        list[CompartmentStatus], msgspec.Meta(max_length=64, extra={LIST_MAP: ("name",)})
    ] = msgspec.field(default_factory=list)
    """Rollout progress per compartment."""
    node_details: Annotated[list[NodeDetail], msgspec.Meta(max_length=MAX_NODE_DETAILS)] = (
        msgspec.field(default_factory=list)
    )
    """At most 20 nodes that need attention, failed first, then blocked, in progress and
    waiting, each with a machine-readable reason."""
    node_details_omitted: NonNegative = 0
    """Not-complete nodes left out of nodeDetails."""


class ObjectMeta(_Model, frozen=True, kw_only=True):
    """The object metadata NodeWright reads and writes (other metadata fields are ignored)."""

    name: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    finalizers: list[str] = msgspec.field(default_factory=list)


class _Resource(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    # No omit_defaults at the top: apiVersion and kind must always be encoded.
    validations: ClassVar[tuple[Rule, ...]] = (
        Rule(
            rule="self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && "
            "size(self.metadata.name) <= 63",
            message="metadata.name must be a DNS label (at most 63 lowercase letters, digits and "
            "'-'): it is used in label and annotation keys",
        ),
    )


class NodeWright(_Resource, frozen=True, kw_only=True):
    """A set of versioned host packages rolled out across matching nodes."""

    api_version: Literal["nodewright.nvidia.com/v1alpha1"] = API_VERSION
    kind: Literal["NodeWright"] = "NodeWright"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: NodeWrightSpec
    status: NodeWrightStatus = msgspec.field(default_factory=NodeWrightStatus)

    @property
    def paused(self) -> bool:
        """Set by annotation nodewright.nvidia.com/pause: "true"."""
        return self.metadata.annotations.get(PAUSE_ANNOTATION) == "true"

    @property
    def disabled(self) -> bool:
        """Set by annotation nodewright.nvidia.com/disable: "true"."""
        return self.metadata.annotations.get(DISABLE_ANNOTATION) == "true"


# ---- DeploymentPolicy -------------------------------------------------------------------


class FixedStrategy(_Model, frozen=True, kw_only=True):
    """Every batch has the same size."""

    batch_size: Positive = 1
    """Nodes per batch (still capped by the budget)."""


class LinearStrategy(_Model, frozen=True, kw_only=True):
    """Batches grow by a constant: initialBatch, +delta, +delta, ..."""

    initial_batch: Positive = 1
    """Size of the first batch."""
    delta: Positive = 1
    """Nodes added after a passing batch (and removed after a failing one, below
    shrinkAfterFailureUntilPercent)."""


class ExponentialStrategy(_Model, frozen=True, kw_only=True):
    """Batches grow by a factor: initialBatch, *growthFactor, *growthFactor, ..."""

    initial_batch: Positive = 1
    """Size of the first batch."""
    growth_factor: Annotated[int, msgspec.Meta(ge=2, le=100)] = 2
    """Multiplier after a passing batch (and divisor after a failing one, below
    shrinkAfterFailureUntilPercent)."""


class Strategy(_Model, frozen=True, kw_only=True):
    """How batch sizes evolve: exactly one of fixed, linear or exponential."""

    validations = (
        Rule(
            rule="[has(self.fixed), has(self.linear), has(self.exponential)]"
            ".filter(x, x).size() == 1",
            message="set exactly one of fixed, linear or exponential",
        ),
    )

    fixed: FixedStrategy | None = None
    """Constant batch size."""
    linear: LinearStrategy | None = None
    """Batches growing by delta."""
    exponential: ExponentialStrategy | None = None
    """Batches growing by growthFactor."""


class Rollout(_Model, frozen=True, kw_only=True):
    """Budget, batch strategy and failure gates of one compartment."""

    budget: Budget
    """Hard cap on nodes of this compartment disrupted at the same time (cordoned, drained or
    running package stages). Batches never exceed it. A percent is of the compartment's nodes
    of one NodeWright."""
    strategy: Strategy | None = None
    """How batch sizes evolve. Unset: every batch is as large as the budget."""
    batch_success_percent: Percent = 100
    """A batch passes when at least this percent of its nodes completed (rounded down). This is
    a success gate, not a concurrency limit (the reference called it batchThreshold)."""
    stop_after_consecutive_failed_batches: Positive | None = None
    """Stop starting new nodes in this compartment after this many failed batches in a row,
    whatever the progress (the reference's failureThreshold). Unset never stops."""
    shrink_after_failure_until_percent: Percent = 50
    """While fewer than this percent of the compartment's nodes are done, a failed batch makes
    the next batch smaller (linear: -delta, exponential: /growthFactor); from then on a failed
    batch keeps the next one the same size. Batches grow only after a passing batch (unlike
    the reference's safetyLimit, this never disables the stop gate)."""
    blocked_nodes_count_as_failed: bool = False
    """Count nodes of a batch that turn out Blocked (ignore label, untolerated taint) as failed
    for the success gate. false: they are left out of the batch's accounting."""
    batch_soak_seconds: Annotated[int, msgspec.Meta(ge=0, le=604800)] = 0
    """Seconds to wait after a batch finished before the next batch of this compartment
    opens: a soak (bake) time to watch the nodes just changed, alerts and workloads on them,
    before more nodes are touched; pause the NodeWright meanwhile to hold the rollout there.
    Nodes waiting for it say BatchSoaking, until when. 0: the next batch opens at once."""
    approval_after_batches: Annotated[
        list[Positive], msgspec.Meta(max_length=64, extra={LIST_SET: True})
    ] = msgspec.field(default_factory=list)
    """Batches after which this compartment waits for a person's approval before its next
    batch opens (`nodewright approve NAME --compartment C`, after any soak): [1] holds the
    rollout after a first, canary batch until someone checked it. Nodes waiting for it say
    BatchAwaitingApproval. Empty: no approval."""


class Compartment(Rollout, frozen=True, kw_only=True):
    """Nodes selected by labels that roll out under their own budget and strategy.

    A node matching several compartments goes to the safest: fixed before linear before
    exponential before no strategy, then the smaller budget, then the name.
    """

    validations = (
        Rule(
            rule="(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || "
            "(has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0)",
            message="selector must not be empty; spec.default covers all remaining nodes",
            field_path=".selector",
        ),
    )

    name: Annotated[
        str,
        _pattern(
            DNS_LABEL_RE,
            "name must be a DNS label (lowercase letters, digits and '-')",
            max_length=63,
            min_length=1,
        ),
    ]
    """Compartment name (unique; renaming it starts its batch state over)."""
    selector: LabelSelector
    """Nodes of this compartment."""


class MaintenanceWindow(_Model, frozen=True, kw_only=True):
    """A recurring time window in which new nodes may start.

    A window with end before start runs past midnight into the next day.
    """

    validations = (
        Rule(
            rule="self.start != self.end",
            message="start and end must differ (for all day, use 00:00 to 23:59)",
            field_path=".end",
        ),
    )

    start: Annotated[str, _pattern(CLOCK_RE, "start must be HH:MM (24 h)", max_length=5)]
    """Start time, HH:MM (24 h), in timeZone."""
    end: Annotated[str, _pattern(CLOCK_RE, "end must be HH:MM (24 h)", max_length=5)]
    """End time, HH:MM (24 h), in timeZone; before start means the next day."""
    days: Annotated[
        list[Weekday],
        msgspec.Meta(max_length=7, extra={LIST_SET: True}),
    ] = msgspec.field(default_factory=list)
    """Days the window starts on (Mon..Sun); empty means every day."""
    time_zone: Annotated[
        str,
        _pattern(
            TIME_ZONE_RE, "timeZone must be an IANA time zone such as Europe/Berlin", max_length=64
        ),
    ] = "UTC"
    """IANA time zone of start and end, e.g. America/New_York."""


class DeploymentPolicySpec(_Model, frozen=True, kw_only=True):
    """How NodeWrights referencing this policy roll out: compartments, budgets, batches, gates."""

    validations = (
        Rule(
            rule="!has(self.compartments) || self.compartments.all(a, "
            "self.compartments.exists_one(b, b.selector == a.selector))",
            message="compartments must have different selectors",
            field_path=".compartments",
        ),
    )

    default: Rollout
    """Rollout of the nodes no compartment selects (compartment __default__)."""
    compartments: Annotated[
        list[Compartment], msgspec.Meta(max_length=32, extra={LIST_MAP: ("name",)})
    ] = msgspec.field(default_factory=list)
    """Label-selected groups of nodes with their own rollout settings."""
    maintenance_windows: Annotated[list[MaintenanceWindow], msgspec.Meta(max_length=16)] = (
        msgspec.field(default_factory=list)
    )
    """If set, new nodes start only inside one of these windows; nodes already started finish
    outside them. Empty: any time."""
    shared_budget: Budget | None = None
    """Cap on nodes disrupted at the same time by all NodeWrights referencing this policy
    together (a percent is of the union of their nodes), on top of each compartment's budget.
    Use it so that several NodeWrights cannot reboot different nodes at once."""
    reset_batch_state_on_completion: bool = True
    """Start the next rollout at batch 1 once a NodeWright is complete."""
    reset_batch_state_on_version_change: bool = True
    """Start at batch 1 when a package version changes (a new rollout), also after a stop."""


class DeploymentPolicyStatus(_Model, frozen=True, kw_only=True):
    """Observed state of the policy."""

    observed_generation: NonNegative = 0
    """metadata.generation this status was computed from."""
    conditions: Annotated[
        list[Condition], msgspec.Meta(max_length=32, extra={LIST_MAP: ("type",)})
    ] = msgspec.field(default_factory=list)
    """Standard conditions."""


class DeploymentPolicy(_Resource, frozen=True, kw_only=True):
    """Reusable rollout rules for NodeWrights: compartments, budgets, batches, gates, windows."""

    api_version: Literal["nodewright.nvidia.com/v1alpha1"] = API_VERSION
    kind: Literal["DeploymentPolicy"] = "DeploymentPolicy"
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: DeploymentPolicySpec
    status: DeploymentPolicyStatus = msgspec.field(default_factory=DeploymentPolicyStatus)


# ---- condition and reason vocabulary ------------------------------------------------------


class ConditionType:
    """Condition types NodeWright sets on its CRs."""

    READY: Final = "Ready"
    DEPLOYMENT_POLICY_NOT_FOUND: Final = "DeploymentPolicyNotFound"
    TAINT_NOT_TOLERATED: Final = "TaintNotTolerated"
    NODES_IGNORED: Final = "NodesIgnored"
    DRAIN_BLOCKED: Final = "DrainBlocked"
    ROLLOUT_STOPPED: Final = "RolloutStopped"
    UNINSTALL_IN_PROGRESS: Final = "UninstallInProgress"
    UNINSTALL_FAILED: Final = "UninstallFailed"
    NODE_STATE_MALFORMED: Final = "NodeStateMalformed"
    DELETION_BLOCKED: Final = "DeletionBlocked"


# ---- decode / encode ----------------------------------------------------------------------

Resource = TypeVar("Resource", NodeWright, DeploymentPolicy)
T = TypeVar("T", bound=msgspec.Struct)


_ENCODER: Final = msgspec.json.Encoder()


def decode(data: bytes | str, kind: type[T]) -> T:
    """Decode CR (or part) JSON into ``kind``; raises msgspec.ValidationError with a $.path."""
    return msgspec.json.decode(data, type=kind)


def from_dict(obj: Mapping[str, Any], kind: type[T]) -> T:
    """Convert a decoded JSON object (e.g. from kubernetes_asyncio) into ``kind``."""
    return msgspec.convert(obj, kind)


class Decoded(Generic[T]):
    """:func:`from_dict` of cached objects of one kind, once per object and resourceVersion:
    a service decodes its NodeWright on every reconcile of every node, and the decode was a
    tenth of a busy service's CPU (issue 15). An object that does not decode raises
    ``msgspec.ValidationError`` on every call, as :func:`from_dict` does. Objects without a
    resourceVersion are decoded each time."""

    def __init__(self, kind: type[T]) -> None:
        self._kind = kind
        self._memo: dict[str, tuple[str, T | str]] = {}
        """name -> (resourceVersion, the object, or why it does not decode)."""

    def __call__(self, obj: Mapping[str, Any]) -> T:
        meta = obj.get("metadata") or {}
        name, version = str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")
        hit = self._memo.get(name)
        if hit is None or not version or hit[0] != version:
            try:
                value: T | str = from_dict(obj, self._kind)
            except msgspec.ValidationError as exc:
                value = str(exc)
            hit = (version, value)
            if version:
                if len(self._memo) > _DECODED_MAX:
                    self._memo.clear()  # objects come and go; a full decode is cheap once
                self._memo[name] = hit
        if isinstance(hit[1], str):
            raise msgspec.ValidationError(hit[1])
        return hit[1]


_DECODED_MAX: Final = 4096


def encode(obj: msgspec.Struct) -> bytes:
    """JSON of ``obj`` with defaults left out (top-level apiVersion and kind always present)."""
    return _ENCODER.encode(obj)


def to_dict(obj: msgspec.Struct) -> dict[str, Any]:
    """``obj`` as plain JSON-compatible builtins, e.g. a request body for kubernetes_asyncio."""
    result = msgspec.to_builtins(obj)
    assert isinstance(result, dict)
    return result
