"""Hypothesis strategies for VALID NodeWright and DeploymentPolicy specs.

Valid means accepted by everything in front of the API: the CRD schema and CEL rules and the
admission webhook (package and label-key syntax, configInterrupts matching configMap keys,
acyclic dependsOn, none on a package being uninstalled from one that stays, known time
zones). A referenced DeploymentPolicy must exist: pass the names that do as ``policies``.
Other suites reuse these to drive the services with specs nobody hand-picked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from hypothesis import strategies as st

from shared import api

# ---- scalars --------------------------------------------------------------------------------

_label = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?\Z", fullmatch=True)
dns_subdomains = st.lists(_label, min_size=1, max_size=3).map(".".join)
label_names = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9_.-]{0,8}[A-Za-z0-9])?\Z", fullmatch=True)
label_keys = st.builds(
    lambda prefix, name: f"{prefix}/{name}" if prefix else name,
    st.none() | dns_subdomains,
    label_names,
)
label_values = st.from_regex(r"\A([A-Za-z0-9]([A-Za-z0-9_.-]{0,8}[A-Za-z0-9])?)?\Z", fullmatch=True)
package_names = st.from_regex(r"\A[a-z]([a-z0-9-]{0,8}[a-z0-9])?\Z", fullmatch=True)
config_keys = st.from_regex(r"\A[A-Za-z0-9_][-._A-Za-z0-9]{0,12}\Z", fullmatch=True)
_number = st.integers(min_value=0, max_value=3000).map(str)
_prerelease = st.lists(
    st.from_regex(r"\A[0-9A-Za-z-]{1,6}\Z", fullmatch=True), min_size=1, max_size=3
).map(".".join)
versions = st.builds(
    lambda v, parts, pre: ("v" if v else "") + ".".join(parts) + (f"-{pre}" if pre else ""),
    st.booleans(),
    st.lists(_number, min_size=1, max_size=3),
    st.none() | _prerelease,
)
_path_component = st.from_regex(r"\A[a-z0-9]{1,5}([._-][a-z0-9]{1,5}){0,2}\Z", fullmatch=True)
images = st.builds(
    lambda registry, port, parts: (
        (registry + (f":{port}" if port else "") + "/" if registry else "") + "/".join(parts)
    ),
    st.none() | dns_subdomains.map(lambda d: d + ".io"),
    st.none() | st.integers(min_value=1, max_value=65535),
    st.lists(_path_component, min_size=1, max_size=3),
)
digests = st.builds(
    lambda hexes: "sha256:" + hexes,
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
)
texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
    | st.sampled_from("\n\t"),
    max_size=40,
)
services = st.from_regex(r"\A[a-z][a-z0-9-]{0,10}\.(service|socket|target)\Z", fullmatch=True)
time_zones = st.sampled_from(
    ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Etc/GMT+5"]
)
clock = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.integers(0, 59))
quantity_units = st.sampled_from(["m", "", "Mi", "Gi", "k"])


def or_default(default: int, low: int, high: int) -> st.SearchStrategy[int]:
    """An int in [low, high] that is often exactly the model default (omitted on the wire, so
    the CRD default must restore it)."""
    return st.just(default) | st.integers(low, high)


# ---- shared shapes --------------------------------------------------------------------------


@st.composite
def label_selectors(draw: st.DrawFn, *, min_terms: int = 0) -> api.LabelSelector:
    match_labels = draw(st.dictionaries(label_keys, label_values, max_size=3))
    expressions = []
    for key in draw(st.lists(label_keys, max_size=3, unique=True)):
        op = draw(st.sampled_from(get_args(api.SelectorOperator)))
        values = (
            draw(st.lists(label_values, min_size=1, max_size=3, unique=True))
            if op in ("In", "NotIn")
            else []
        )
        expressions.append(api.LabelSelectorRequirement(key=key, operator=op, values=values))
    if min_terms and not match_labels and not expressions:
        match_labels = {draw(label_keys): draw(label_values)}
    return api.LabelSelector(match_labels=match_labels, match_expressions=expressions)


@st.composite
def tolerations(draw: st.DrawFn) -> api.Toleration:
    effect = draw(st.sampled_from(get_args(api.TaintEffect)))
    seconds = draw(st.none() | st.integers(0, 86400)) if effect == "NoExecute" else None
    if draw(st.booleans()):
        return api.Toleration(
            key=draw(st.just("") | label_keys),
            operator="Exists",
            effect=effect,
            toleration_seconds=seconds,
        )
    return api.Toleration(
        key=draw(label_keys),
        operator="Equal",
        value=draw(label_values),
        effect=effect,
        toleration_seconds=seconds,
    )


budgets = st.one_of(
    st.builds(api.Budget, percent=st.integers(1, 100)),
    st.builds(api.Budget, count=st.integers(1, 10_000)),
)


@st.composite
def interrupts(draw: st.DrawFn) -> api.Interrupt:
    kind: api.InterruptType = draw(st.sampled_from(get_args(api.InterruptType)))
    units: list[str] = []
    if kind == "service":
        units = draw(st.lists(services, min_size=1, max_size=3, unique=True))
    return api.Interrupt(type=kind, services=units)


# ---- packages -------------------------------------------------------------------------------


@st.composite
def env_vars(draw: st.DrawFn, name: str) -> api.EnvVar:
    ref = api.ObjectKeySelector(
        name=draw(dns_subdomains), key=draw(config_keys), optional=draw(st.booleans())
    )
    source = draw(st.sampled_from(["value", "none", "secret", "configMap", "field", "resource"]))
    match source:
        case "value":
            return api.EnvVar(name=name, value=draw(texts))
        case "none":
            return api.EnvVar(name=name)
        case "secret":
            return api.EnvVar(name=name, value_from=api.EnvVarSource(secret_key_ref=ref))
        case "configMap":
            return api.EnvVar(name=name, value_from=api.EnvVarSource(config_map_key_ref=ref))
        case "field":
            field = api.ObjectFieldSelector(
                field_path=draw(st.sampled_from(["spec.nodeName", "metadata.name"]))
            )
            return api.EnvVar(name=name, value_from=api.EnvVarSource(field_ref=field))
        case _:
            divisor: int | str | None = draw(st.sampled_from([None, 1, "1Mi", "1m"]))
            res = api.ResourceFieldSelector(
                resource=draw(st.sampled_from(["limits.cpu", "requests.memory"])),
                divisor=divisor,
            )
            return api.EnvVar(name=name, value_from=api.EnvVarSource(resource_field_ref=res))


@st.composite
def _quantity_pair(draw: st.DrawFn) -> tuple[int | str | None, int | str | None]:
    """(request, limit) with limit >= request, either possibly absent."""
    base = draw(st.integers(1, 4000))
    extra = draw(st.integers(0, 4000))
    unit = draw(quantity_units)
    if unit == "" and draw(st.booleans()):
        request: int | str = base
        limit: int | str = base + extra
    else:
        request, limit = f"{base}{unit}", f"{base + extra}{unit}"
    which = draw(st.sampled_from(["both", "request", "limit"]))
    return (request if which != "limit" else None, limit if which != "request" else None)


@st.composite
def resources(draw: st.DrawFn) -> api.Resources:
    cpu_req, cpu_lim = draw(_quantity_pair())
    mem_req, mem_lim = draw(_quantity_pair())
    return api.Resources(
        requests=api.ResourceList(cpu=cpu_req, memory=mem_req),
        limits=api.ResourceList(cpu=cpu_lim, memory=mem_lim),
    )


@st.composite
def packages(draw: st.DrawFn, name: str, earlier: dict[str, api.Package]) -> api.Package:
    config = draw(st.dictionaries(config_keys, texts, max_size=3))
    config_interrupts: dict[str, api.Interrupt] = {}
    for key in draw(st.lists(st.sampled_from(sorted(config)), unique=True)) if config else []:
        pattern = draw(st.sampled_from([key, key[:1] + "*", "*"]))
        config_interrupts[pattern] = draw(interrupts())
    depends = draw(st.lists(st.sampled_from(sorted(earlier)), unique=True)) if earlier else []
    env_names = draw(
        st.lists(
            st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z", fullmatch=True), max_size=3, unique=True
        )
    )
    requested = draw(st.booleans())
    uninstall = draw(
        st.none()
        | st.just(api.Uninstall(enabled=True, requested=requested))
        | st.just(api.Uninstall())
    )
    # A package being uninstalled is depended on only by packages being uninstalled too.
    leaving = uninstall is not None and uninstall.requested
    depends = [d for d in depends if leaving or not _leaving(earlier[d])]
    return api.Package(
        version=draw(versions),
        image=draw(images),
        digest=draw(st.just("") | digests),
        interrupt=draw(st.none() | interrupts()),
        config_map=config,
        config_interrupts=config_interrupts,
        env=[draw(env_vars(n)) for n in env_names],
        depends_on={d: earlier[d].version for d in depends},
        resources=draw(st.none() | resources()),
        graceful_shutdown_seconds=draw(st.none() | st.integers(0, 3600)),
        stage_timeout_seconds=draw(st.none() | st.integers(1, 604800)),
        uninstall=uninstall,
    )


def _leaving(pkg: api.Package) -> bool:
    return pkg.uninstall is not None and pkg.uninstall.requested


@st.composite
def drain_options(draw: st.DrawFn) -> api.DrainOptions:
    return api.DrainOptions(
        only_for_interrupts=draw(st.booleans()),
        timeout_seconds=draw(or_default(3600, 0, 604800)),
        grace_period_seconds=draw(st.none() | st.integers(0, 86400)),
        delete_empty_dir_data=draw(st.booleans()),
        ignore_daemon_sets=draw(st.booleans()),
        unmanaged_pods=draw(st.sampled_from(get_args(api.UnmanagedPodPolicy))),
        pod_selector=draw(st.none() | label_selectors()),
    )


@st.composite
def nodewright_specs(draw: st.DrawFn, *, policies: Sequence[str] = ()) -> api.NodeWrightSpec:
    """A valid NodeWrightSpec; it references a policy only if ``policies`` names some."""
    pkgs: dict[str, api.Package] = {}
    for name in draw(st.lists(package_names, min_size=1, max_size=4, unique=True)):
        pkgs[name] = draw(packages(name, dict(pkgs)))
    policy = draw(st.none() | st.sampled_from(list(policies))) if policies else None
    options = None
    if policy is not None:
        options = draw(
            st.none()
            | st.builds(
                api.DeploymentPolicyOptions,
                reset_batch_state_on_completion=st.none() | st.booleans(),
                reset_batch_state_on_version_change=st.none() | st.booleans(),
            )
        )
    runtime_required = draw(st.booleans())
    return api.NodeWrightSpec(
        packages=pkgs,
        node_selectors=draw(label_selectors()),
        interruption_budget=None if policy is not None else draw(st.none() | budgets),
        deployment_policy=policy,
        deployment_policy_options=options,
        pod_non_interrupt_labels=draw(st.none() | label_selectors()),
        additional_tolerations=draw(st.lists(tolerations(), max_size=3)),
        priority=draw(or_default(200, 1, 1000)),
        sequencing=draw(st.sampled_from(get_args(api.Sequencing))),
        runtime_required=runtime_required,
        auto_taint_new_nodes=runtime_required and draw(st.booleans()),
        drain=draw(drain_options()),
        stage_timeout_seconds=draw(or_default(1800, 1, 604800)),
    )


# ---- DeploymentPolicy -----------------------------------------------------------------------

strategies = st.one_of(
    st.builds(api.Strategy, fixed=st.builds(api.FixedStrategy, batch_size=or_default(1, 1, 50))),
    st.builds(
        api.Strategy,
        linear=st.builds(
            api.LinearStrategy, initial_batch=or_default(1, 1, 50), delta=or_default(1, 1, 50)
        ),
    ),
    st.builds(
        api.Strategy,
        exponential=st.builds(
            api.ExponentialStrategy,
            initial_batch=or_default(1, 1, 50),
            growth_factor=or_default(2, 2, 10),
        ),
    ),
)

_rollout_fields = {
    "budget": budgets,
    "strategy": st.none() | strategies,
    "batch_success_percent": or_default(100, 1, 100),
    "stop_after_consecutive_failed_batches": st.none() | st.integers(1, 20),
    "shrink_after_failure_until_percent": or_default(50, 1, 100),
    "blocked_nodes_count_as_failed": st.booleans(),
    "batch_soak_seconds": or_default(0, 1, 3600),
    "approval_after_batches": st.just([]) | st.lists(st.integers(1, 20), unique=True, max_size=3),
}


@st.composite
def compartments(draw: st.DrawFn, index: int) -> api.Compartment:
    selector = draw(label_selectors())
    # A label only this compartment selects keeps selectors distinct (a CEL rule).
    labels = {**selector.match_labels, "pool.example.com/compartment": f"c{index}"}
    return draw(
        st.builds(
            api.Compartment,
            name=st.just(f"c{index}") | _label.map(lambda s: f"{s}-{index}"),
            selector=st.just(
                api.LabelSelector(match_labels=labels, match_expressions=selector.match_expressions)
            ),
            **_rollout_fields,
        )
    )


@st.composite
def maintenance_windows(draw: st.DrawFn) -> api.MaintenanceWindow:
    start = draw(clock)
    end = draw(clock.filter(lambda e: e != start))
    return api.MaintenanceWindow(
        start=start,
        end=end,
        days=draw(
            st.lists(
                st.sampled_from(get_args(api.Weekday)),
                max_size=7,
                unique=True,
            )
        ),
        time_zone=draw(time_zones),
    )


@st.composite
def deployment_policy_specs(draw: st.DrawFn) -> api.DeploymentPolicySpec:
    count = draw(st.integers(0, 3))
    return api.DeploymentPolicySpec(
        default=draw(st.builds(api.Rollout, **_rollout_fields)),
        compartments=[draw(compartments(i)) for i in range(count)],
        maintenance_windows=draw(st.lists(maintenance_windows(), max_size=3)),
        shared_budget=draw(st.none() | budgets),
        reset_batch_state_on_completion=draw(st.booleans()),
        reset_batch_state_on_version_change=draw(st.booleans()),
    )
