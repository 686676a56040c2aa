"""Every sample under deploy/samples is accepted by the API server and the webhook, unchanged."""

from __future__ import annotations

import asyncio
import json
import shutil
from datetime import UTC, datetime
from typing import Any

import pytest

from nodewright.rig import Rig
from services.validator import webhook
from shared import api
from tests.api import crds
from tests.api.conftest import Objects

pytestmark = pytest.mark.rig


async def test_every_sample_is_accepted(objects: Objects, running_webhook: webhook.Webhook) -> None:
    applied = []
    for name, manifest in crds.samples():
        created = await objects.create(manifest)
        applied.append(name)
        # What the server stores (with its defaults filled in) is what the models mean.
        if manifest["kind"] == "NodeWright":
            assert _spec(created, api.NodeWright) == _spec(manifest, api.NodeWright), name
        else:
            assert _spec(created, api.DeploymentPolicy) == _spec(manifest, api.DeploymentPolicy)
    assert len(applied) == len(list(crds.SAMPLES_DIR.glob("*.yaml"))) >= 7


def _spec(doc: dict[str, Any], kind: type[api.Resource]) -> Any:
    return api.from_dict(doc, kind).spec


async def test_printer_columns_and_ready_condition(objects: Objects) -> None:
    manifest = dict(crds.samples())["nodewright-gpu-node-tuning.yaml"]
    created = await objects.create(manifest)
    path = f"{crds.NODEWRIGHTS}/{created['metadata']['name']}"
    status = api.NodeWrightStatus(
        observed_generation=1,
        state="InProgress",
        complete_nodes="3/5",
        package_list="nvidia-tuned:0.9.0",
        node_counts=api.NodeCounts(target=5, complete=3, in_progress=2),
        conditions=[
            api.Condition(
                type="Ready",
                status="False",
                reason="Progressing",
                message="3/5 nodes complete",
                last_transition_time=datetime.now(UTC).replace(microsecond=0),
                observed_generation=1,
            )
        ],
    )
    body = {**created, "status": api.to_dict(status)}
    stored = await objects.kube.replace(f"{path}/status", body)
    assert api.from_dict(stored, api.NodeWright).status == status

    resp = await objects.kube.api.send(
        "GET",
        path,
        params=[],
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        body=None,
        timeout_s=30,
    )
    try:
        table = json.loads(await resp.text())
    finally:
        resp.release()
    columns = [c["name"] for c in table["columnDefinitions"]]
    row = dict(zip(columns, table["rows"][0]["cells"], strict=True))
    assert row["Status"] == "InProgress"
    assert row["Complete"] == "3/5"
    assert row["Packages"] == "nvidia-tuned:0.9.0"
    assert row["In-Progress"] == 2
    assert row["Priority"] == 200


async def _kubectl(rig: Rig, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        f"--kubeconfig={rig.endpoints.kubeconfig}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_waits_for_ready_and_explains_fields(rig: Rig, objects: Objects) -> None:
    manifest = dict(crds.samples())["nodewright-gpu-node-tuning.yaml"]
    created = await objects.create({**manifest, "metadata": {"name": "kubectl-wait"}})
    name = created["metadata"]["name"]
    code, out = await _kubectl(rig, "get", "nodewright", name)
    assert code == 0, out
    generation = created["metadata"]["generation"]
    ready = api.Condition(
        type=api.ConditionType.READY,
        status="True",
        reason="NodesConverged",
        last_transition_time=datetime.now(UTC).replace(microsecond=0),
        observed_generation=generation,
    )
    # kubectl wait also requires status.observedGeneration to have caught up.
    status = api.NodeWrightStatus(
        observed_generation=generation, state="Complete", conditions=[ready]
    )
    await objects.kube.replace(
        f"{crds.NODEWRIGHTS}/{name}/status", {**created, "status": api.to_dict(status)}
    )
    code, out = await _kubectl(
        rig, "wait", "--for=condition=Ready", f"nodewright/{name}", "--timeout=20s"
    )
    assert code == 0, out
    code, out = await _kubectl(rig, "explain", "nodewright.spec.drain.unmanagedPods")
    assert code == 0, out
    assert "Eviction API" in out
