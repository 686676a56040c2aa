"""The Argo CD health check (deploy/argocd/health-nodewright.lua) in real Lua interpreters: the
harness and the cases no rollout produces on purpose (no status yet, a generation the status
service has not seen, a deletion before any condition), and the argocd-cm command of
docs/install.md run against the real API server. Health from statuses that real rollouts
wrote: tests/e2e/test_argocd_health.py."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nodewright.rig import Rig
from shared import api
from shared.kube import ApiError, Kube, path_of
from tests.deploy.argocd import HEALTH_LUA, INTERPRETERS, health, health_everywhere, to_lua
from tests.helpers.waiting import eventually

REPO = HEALTH_LUA.parents[2]
INSTALL_MD = REPO / "docs" / "install.md"
KEY = "resource.customizations.health.nodewright.nvidia.com_NodeWright"


def _nw(generation: int = 1, **status: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": "gpu", "generation": generation},
        "spec": {"packages": {"tuning": {"version": "1.0.0", "image": "registry.example/t"}}},
    }
    if status:
        obj["status"] = status
    return obj


def _ready(status: str, reason: str, message: str, generation: int = 1) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


@pytest.mark.parametrize("lua", INTERPRETERS)
def test_a_new_nodewright_without_status_is_progressing(lua: str) -> None:
    assert health(_nw(), lua) == (
        "Progressing",
        "Waiting for NodeWright to observe generation 1",
    )


def test_a_generation_the_status_service_has_not_seen_is_progressing_even_if_it_was_ready() -> None:
    ready = _ready("True", "Complete", "2/2 nodes complete")
    obj = _nw(2, observedGeneration=1, state="Complete", conditions=[ready])
    assert health_everywhere(obj) == (
        "Progressing",
        "Waiting for NodeWright to observe generation 2",
    )
    # observed, but the Ready condition is still the old generation's
    obj = _nw(2, observedGeneration=2, state="Complete", conditions=[ready])
    assert health_everywhere(obj) == (
        "Progressing",
        "Waiting for the Ready condition of generation 2",
    )


def test_a_deletion_without_conditions_is_progressing() -> None:
    obj = _nw(observedGeneration=1, state="Complete")
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert health_everywhere(obj) == ("Progressing", "Deleting")


def test_a_missing_policy_is_degraded_naming_it() -> None:
    message = "DeploymentPolicy gpu-rollout does not exist: no new node starts until it is created"
    obj = _nw(
        observedGeneration=1,
        state="Waiting",
        nodeCounts={"target": 2, "waiting": 2},
        conditions=[
            _ready("False", "Waiting", "0/2 nodes complete, 2 waiting (...)"),
            {
                "type": "DeploymentPolicyNotFound",
                "status": "True",
                "reason": "DeploymentPolicyNotFound",
                "message": message,
                "observedGeneration": 1,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ],
    )
    assert health_everywhere(obj) == ("Degraded", f"DeploymentPolicyNotFound: {message}")


def test_a_rollout_waiting_only_for_an_approval_is_suspended_as_a_paused_rollout() -> None:
    message = (
        "compartment __default__ waits for approval after batch 1 (approvalAfterBatches): "
        "check its nodes, then `nodewright approve gpu --compartment __default__` (3 nodes, "
        "e.g. gpu-1)"
    )
    waiting = {"name": "__default__", "waitingReason": "BatchAwaitingApproval"}
    obj = _nw(
        observedGeneration=1,
        state="Waiting",
        nodeCounts={"target": 4, "complete": 1, "waiting": 3},
        compartments=[
            {"name": "canary", "waitingReason": ""},
            {**waiting, "waitingMessage": message},
        ],
        conditions=[_ready("False", "Waiting", "1/4 nodes complete, 3 waiting (...)")],
    )
    assert health_everywhere(obj) == ("Suspended", f"Awaiting approval: {message}")
    # Another compartment still moving: progressing.
    moving = {**obj, "status": {**obj["status"], "nodeCounts": {"target": 4, "inProgress": 1}}}
    assert health_everywhere(moving)[0] == "Progressing"
    # A failed node still says Degraded first.
    failed = {**obj, "status": {**obj["status"], "nodeCounts": {"target": 4, "failed": 1}}}
    assert health_everywhere(failed)[0] == "Degraded"


def test_messages_keep_quotes_backslashes_newlines_and_utf8() -> None:
    message = 'gpu-0: StageFailed: exit 1 "no \\ such" file\nnächste Zeile — ✓'
    obj = _nw(
        observedGeneration=1,
        state="Failed",
        nodeCounts={"target": 1, "failed": 1},
        conditions=[_ready("False", "Failed", message)],
    )
    assert health_everywhere(obj) == ("Degraded", f"Failed: {message}")


def test_the_lua_table_form_of_an_object() -> None:
    assert to_lua({"a": [1, None, "x"], "end": True, "b-c": {"d": None, "e": 1.5}}) == (
        '{a = {1, "x"}, ["end"] = true, ["b-c"] = {e = 1.5}}'
    )


def test_the_check_cannot_reach_os_io_or_require(tmp_path: Path) -> None:
    """As in Argo CD, a health check has no os, io or require: the harness refuses them."""
    for call in ("os.time()", "io.write('x')", "require('x')"):
        script = tmp_path / "bad.lua"
        script.write_text(f"local t = {call}\nreturn {{status = 'Healthy', message = ''}}\n")
        for lua in INTERPRETERS:
            with pytest.raises(AssertionError, match=f"{lua} failed"):
                health(_nw(), lua, script)


def test_the_check_is_lua_5_1() -> None:
    """Argo CD's gopher-lua implements Lua 5.1: luac5.1 must compile it."""
    ran = subprocess.run(
        ["luac5.1", "-p", str(HEALTH_LUA)], capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr


# ---- docs/install.md: putting it into argocd-cm -------------------------------------------------


def _argocd_cm_command() -> str:
    """The shell command docs/install.md gives for argocd-cm (an indented block after the
    line naming it)."""
    text = INSTALL_MD.read_text()
    m = re.search(r"<!-- argocd-cm -->\n\n((?:    .*\n)+)", text)
    assert m, "docs/install.md has no argocd-cm command block after <!-- argocd-cm -->"
    return "\n".join(line[4:] for line in m[1].splitlines())


async def test_the_documented_argocd_cm_command_sets_the_check_and_keeps_the_rest(
    rig: Rig, kapi: Kube, tmp_path: Path
) -> None:
    """Run it as written (kubectl from PATH, as a user would) on a stand-in argocd-cm that
    Argo CD's own keys are in."""
    ns, cm = "argocd", path_of(plural="configmaps", namespace="argocd", name="argocd-cm")
    await kapi.delete_if_present(path_of(plural="namespaces", name=ns))

    async def created() -> bool:
        try:
            await kapi.create(path_of(plural="namespaces"), {"metadata": {"name": ns}})
        except ApiError as exc:
            if not exc.conflict:  # 409: still terminating from an earlier run
                raise
            return False
        return True

    await eventually(created, timeout_s=60, what="namespace argocd")
    try:
        await kapi.create(
            path_of(plural="configmaps", namespace=ns),
            {
                "metadata": {
                    "name": "argocd-cm",
                    "labels": {"app.kubernetes.io/part-of": "argocd"},
                },
                "data": {"url": "https://argocd.example", "timeout.reconciliation": "180s"},
            },
        )
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "kubectl").symlink_to(rig.bin_dir / "kubectl")
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "KUBECONFIG": str(rig.endpoints.kubeconfig),
        }
        command = _argocd_cm_command()
        for _ in range(2):  # idempotent: a second run changes nothing and does not fail
            proc = await asyncio.create_subprocess_exec(
                "bash", "-euo", "pipefail", "-c", command,
                cwd=REPO, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
        got = await kapi.get(cm)
        assert got["data"] == {
            "url": "https://argocd.example",
            "timeout.reconciliation": "180s",
            KEY: HEALTH_LUA.read_text(),
        }
        assert got["metadata"]["labels"] == {"app.kubernetes.io/part-of": "argocd"}
    finally:
        await kapi.delete_if_present(path_of(plural="namespaces", name=ns))
