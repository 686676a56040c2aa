"""``nodewright uninstall-all`` end to end, on the real rig with the five services as
processes, run as a process with the credentials of the chart's pre-delete hook (its own
ServiceAccount and ClusterRole, rendered from the chart): it deletes every NodeWright, reports
the one being uninstalled while it remains, then deletes the DeploymentPolicy once the
NodeWrights are gone and exits 0; a paused NodeWright blocks its deletion, and the command
times out naming it and its DeletionBlocked condition, and finishes once it is resumed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from nodewright import manifests
from nodewright.rig import Rig
from services.scheduler.core import FINALIZER
from shared import api
from shared.kube import Kube, path_of
from tests.deploy.helm import render, run
from tests.e2e.conftest import NODES, Services, read_cr
from tests.e2e.test_lifecycle import _cr, _executor, _start, _wait_done
from tests.e2e.test_uninstall import _tuning
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(600)
SIM = "sim.nodewright.nvidia.com"
HOOK = "nodewright-uninstall-all"


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


async def hook_kubeconfig(rig: Rig, namespace: str) -> Path:
    """A kubeconfig of the hook's ServiceAccount, with the hook's RBAC from the chart."""
    docs = await render(
        "--set", "uninstallHook.enabled=true", "-s", "templates/uninstall-hook.yaml",
        "-n", namespace, bin_dir=rig.bin_dir,
    )  # fmt: skip
    rbac = [d for d in docs if d["kind"] != "Job"]
    assert [d["kind"] for d in rbac] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    kubectl = (str(rig.bin_dir / "kubectl"), "--kubeconfig", str(rig.endpoints.kubeconfig))
    await run(*kubectl, "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    token = await run(*kubectl, "create", "token", HOOK, "-n", namespace, "--duration=1h")
    return rig.write_kubeconfig(
        rig.dir / f"kubeconfig-{HOOK}-{namespace}", user=HOOK, token=token.strip()
    )


@pytest.fixture
async def hook(rig: Rig, kapi: Kube) -> AsyncIterator[Callable[[str], Awaitable[Path]]]:
    """:func:`hook_kubeconfig`; the hook's cluster-scoped RBAC is deleted afterwards (its
    ServiceAccount goes with the services' namespace)."""

    async def make(namespace: str) -> Path:
        return await hook_kubeconfig(rig, namespace)

    try:
        yield make
    finally:
        rbac = "rbac.authorization.k8s.io"
        for plural in ("clusterrolebindings", "clusterroles"):
            await kapi.delete_if_present(
                path_of(group=rbac, version="v1", plural=plural, name=HOOK)
            )


async def uninstall_all(kubeconfig: Path, *args: str) -> Result:
    """``python -m nodewright.cli uninstall-all ARGS --kubeconfig KUBECONFIG``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nodewright.cli", "uninstall-all", *args,
        "--kubeconfig", str(kubeconfig),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    print(out.decode(), err.decode(), sep="\n", file=sys.stderr)
    return Result(proc.returncode, out.decode(), err.decode())


async def _names(kapi: Kube, path: str) -> list[str]:
    return sorted(o["metadata"]["name"] for o in (await kapi.get(path))["items"])


def _policy(name: str) -> dict[str, object]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"batchSize": 2}}}},
    }


async def test_uninstall_all_waits_for_the_uninstalls_then_deletes_the_policies(
    hook: Callable[[str], Awaitable[Path]], cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    await _start(kapi, services, names)
    kubeconfig = await hook(services.namespace)
    await manifests.apply(kapi, _policy("pairs"))
    cr = _cr("bye", {"tuning": _tuning(False)}, 2)
    del cr["spec"]["interruptionBudget"]
    cr["spec"]["deploymentPolicy"] = "pairs"
    await manifests.apply(kapi, cr)
    await _wait_done(kapi, "bye", "the install")
    assert FINALIZER in (await read_cr(kapi, "bye")).metadata.finalizers
    # Slow stages from now on, so the uninstall is seen while it runs.
    for n in names:
        await kapi.patch(
            f"{NODES}/{n}", {"metadata": {"annotations": {f"{SIM}/stage-duration": "4s"}}}
        )

    done = await uninstall_all(kubeconfig, "--wait", "--timeout", "120")

    assert done.code == 0, done
    assert done.err == ""
    lines = done.out.splitlines()
    assert lines[0] == (
        "Deleted NodeWright bye: its finalizer uninstalls its uninstall-enabled packages from "
        "its nodes, then it goes."
    )
    assert lines[1].startswith("Waiting for 1 NodeWright to be deleted (0s of 120s):")
    progress = [line for line in lines if line.startswith("  bye: ")]
    assert any(
        line.startswith("  bye: UninstallInProgress (Deleting): uninstall pending on ")
        and line.endswith(" of 2 nodes")
        for line in progress
    ), progress
    assert all("DeletionBlocked" not in line for line in progress), progress
    assert lines[-3].startswith("Every NodeWright is gone (")
    assert lines[-2:] == [
        "Deleted DeploymentPolicy pairs.",
        "Nothing of NodeWright's is left: no NodeWright, no DeploymentPolicy.",
    ]
    assert await _names(kapi, manifests.NODEWRIGHTS) == []
    assert await _names(kapi, manifests.POLICIES) == []
    for n in names:  # the finalizer really uninstalled the package
        assert "tuning" not in (await _executor(kapi, n, "bye")).packages

    again = await uninstall_all(kubeconfig, "--wait", "--timeout", "120")
    assert (again.code, again.out, again.err) == (
        0,
        "Nothing of NodeWright's is left: no NodeWright, no DeploymentPolicy.\n",
        "",
    )


async def test_a_paused_nodewright_blocks_uninstall_all_until_it_is_resumed(
    hook: Callable[[str], Awaitable[Path]], cluster: Kube, services: Services
) -> None:
    kapi = cluster
    await _start(kapi, services, ["gpu-00"])
    kubeconfig = await hook(services.namespace)
    await manifests.apply(kapi, _policy("single"))
    cr = _cr("held", {"tuning": _tuning(False)}, 1)
    del cr["spec"]["interruptionBudget"]
    cr["spec"]["deploymentPolicy"] = "single"
    await manifests.apply(kapi, cr)
    await _wait_done(kapi, "held", "the install")
    path = f"{manifests.NODEWRIGHTS}/held"
    await kapi.patch(path, {"metadata": {"annotations": {api.PAUSE_ANNOTATION: "true"}}})

    # Without --wait: the deletion is requested, the referenced policy is left.
    started = await uninstall_all(kubeconfig)
    assert started.code == 0, started
    assert started.out.splitlines()[0].startswith("Deleted NodeWright held: ")
    assert started.out.splitlines()[-1] == (
        "1 NodeWright still being deleted, so the DeploymentPolicies are left (the webhook "
        "refuses deleting a policy still named): run `nodewright uninstall-all --wait` to "
        "wait for them and finish."
    )
    assert await _names(kapi, manifests.POLICIES) == ["single"]

    async def blocked() -> bool:
        conditions = (await read_cr(kapi, "held")).status.conditions
        return any(c.type == api.ConditionType.DELETION_BLOCKED for c in conditions)

    await eventually(blocked, what="the DeletionBlocked condition")

    stuck = await uninstall_all(kubeconfig, "--wait", "--timeout", "10")
    assert stuck.code == 1, stuck
    lines = stuck.out.splitlines()
    assert lines[0] == "NodeWright held is being deleted already."
    assert lines[1].startswith("Waiting for 1 NodeWright to be deleted (0s of 10s):")
    assert lines[2].startswith(
        "  held: DeletionBlocked (PausedWithPendingUninstall): the NodeWright is paused: remove "
        f"the annotation {api.PAUSE_ANNOTATION} so its uninstalls can run; UninstallInProgress "
        "(Deleting): uninstall pending on 1 of 1 nodes"
    ), lines
    assert stuck.err == (
        "nodewright: timed out after 10s with 1 NodeWright left: held (DeletionBlocked "
        "(PausedWithPendingUninstall); UninstallInProgress (Deleting)); the DeploymentPolicies "
        'were not deleted. Do what each condition says (docs/packages.md "Deleting a '
        'NodeWright"; `nodewright node list --nodewright NAME` shows its nodes) and run '
        "`nodewright uninstall-all --wait` again, or abandon a NodeWright's uninstall (its "
        "packages stay on the nodes) by removing its finalizer: kubectl patch nodewright NAME "
        '--type=merge -p \'{"metadata":{"finalizers":null}}\'\n'
    )
    assert await _names(kapi, manifests.NODEWRIGHTS) == ["held"]
    assert await _names(kapi, manifests.POLICIES) == ["single"]

    await kapi.patch(path, {"metadata": {"annotations": {api.PAUSE_ANNOTATION: None}}})
    done = await uninstall_all(kubeconfig, "--wait", "--timeout", "120")
    assert done.code == 0, done
    assert done.out.splitlines()[-2:] == [
        "Deleted DeploymentPolicy single.",
        "Nothing of NodeWright's is left: no NodeWright, no DeploymentPolicy.",
    ]
    assert await _names(kapi, manifests.NODEWRIGHTS) == []
    assert await _names(kapi, manifests.POLICIES) == []
