"""Property: model -> JSON -> API server -> JSON -> model is lossless for valid specs.

The API server prunes unknown fields, applies the CRD defaults and runs every CEL rule; a spec
that comes back different means the models and the CRDs disagree (a field the schema lacks,
a default that differs, a constraint only one side has).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings

from shared import api
from shared.kube import ApiError, Kube
from tests.api import crds, strategies
from tests.api.conftest import unique

pytestmark = pytest.mark.rig

POLICY = "roundtrip-policy"
EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


async def _ensure_policy(kube: Kube) -> None:
    body = api.to_dict(
        api.DeploymentPolicy(
            metadata=api.ObjectMeta(name=POLICY),
            spec=api.DeploymentPolicySpec(default=api.Rollout(budget=api.Budget(count=1))),
        )
    )
    try:
        await kube.create(crds.POLICIES, body)
    except ApiError as exc:
        if not exc.conflict:
            raise


@EXAMPLES
@given(spec=strategies.nodewright_specs(policies=[POLICY]))
@example(spec=api.NodeWrightSpec(packages={"a": api.Package(version="1", image="r/a")}))
async def test_nodewright_specs_survive_the_api_server(
    crd_kube: Kube, spec: api.NodeWrightSpec
) -> None:
    await _ensure_policy(crd_kube)
    sent = api.NodeWright(metadata=api.ObjectMeta(name=unique("rt")), spec=spec)
    created = await crd_kube.create(crds.NODEWRIGHTS, api.to_dict(sent))
    path = f"{crds.NODEWRIGHTS}/{sent.metadata.name}"
    try:
        assert api.from_dict(created, api.NodeWright).spec == spec
        again = api.decode(api.encode(api.from_dict(created, api.NodeWright)), api.NodeWright)
        assert again.spec == spec
        fetched = await crd_kube.get(path)
        assert api.from_dict(fetched, api.NodeWright).spec == spec
    finally:
        await crd_kube.delete(path)


@EXAMPLES
@given(spec=strategies.deployment_policy_specs())
@example(spec=api.DeploymentPolicySpec(default=api.Rollout(budget=api.Budget(percent=1))))
async def test_policy_specs_survive_the_api_server(
    crd_kube: Kube, spec: api.DeploymentPolicySpec
) -> None:
    sent = api.DeploymentPolicy(metadata=api.ObjectMeta(name=unique("rt")), spec=spec)
    created = await crd_kube.create(crds.POLICIES, api.to_dict(sent))
    path = f"{crds.POLICIES}/{sent.metadata.name}"
    try:
        assert api.from_dict(created, api.DeploymentPolicy).spec == spec
        fetched = await crd_kube.get(path)
        assert api.from_dict(fetched, api.DeploymentPolicy).spec == spec
    finally:
        await crd_kube.delete(path)
