"""Explicit uninstall end to end, on the real rig with the five services as processes: an
uninstall request runs ``uninstall``, its check and the package's interrupt on every node,
then the package is absent; cancelling while the uninstall stage runs installs it again.

(Uninstall on NodeWright deletion through a finalizer is not implemented yet.)
"""

from __future__ import annotations

import json

import pytest

from nodewright import manifests
from shared.kube import Kube
from tests.e2e.conftest import NODES, Services
from tests.e2e.test_lifecycle import _cr, _executor, _patch_cr, _start, _wait_done, pod_log
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(400)
SIM = "sim.nodewright.nvidia.com"


def _tuning(requested: bool) -> dict[str, object]:
    return {
        "version": "1.0.0",
        "image": "registry.example/tuning",
        "interrupt": {"type": "service", "services": ["containerd"]},
        "uninstall": {"enabled": True, "requested": requested},
    }


async def test_an_uninstall_request_runs_uninstall_its_check_and_interrupt_then_the_package_is_gone(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    await _start(kapi, services, names)
    async with pod_log(kapi, services.namespace) as log:
        await manifests.apply(kapi, _cr("gone", {"tuning": _tuning(False)}, 2))
        await _wait_done(kapi, "gone", "the install")
        mark = len(log.events)
        await _patch_cr(kapi, "gone", {"packages": {"tuning": {"uninstall": {"requested": True}}}})
        await _wait_done(kapi, "gone", "the uninstall")
    for n in names:
        assert [(e.role, e.package, e.stage) for e in log.created(mark, node=n)] == [
            ("stage", "tuning", "uninstall"),
            ("check", "tuning", "uninstall"),
            ("interrupt", "", "interrupt"),
        ]
        intr = log.created(mark, node=n, role="interrupt")[0]
        assert json.loads(intr.env["NODEWRIGHT_INTERRUPT"]) == {
            "type": "service",
            "services": ["containerd"],
        }
        rec = await _executor(kapi, n, "gone")
        assert "tuning" not in rec.packages


async def test_cancelling_an_uninstall_before_its_interrupt_installs_the_package_again(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00"]
    await _start(kapi, services, names)
    async with pod_log(kapi, services.namespace) as log:
        await manifests.apply(kapi, _cr("back", {"tuning": _tuning(False)}, 1))
        await _wait_done(kapi, "back", "the install")
        # Slow stages from now on, so the uninstall stage is still running when cancelled.
        await kapi.patch(
            f"{NODES}/gpu-00", {"metadata": {"annotations": {f"{SIM}/stage-duration": "8s"}}}
        )
        mark = len(log.events)
        await _patch_cr(kapi, "back", {"packages": {"tuning": {"uninstall": {"requested": True}}}})

        async def uninstalling() -> bool:
            return bool(log.created(mark, role="stage", stage="uninstall"))

        await eventually(uninstalling, what="the uninstall stage pod")
        await _patch_cr(kapi, "back", {"packages": {"tuning": {"uninstall": {"requested": False}}}})
        await _wait_done(kapi, "back", "the reinstall", timeout_s=180)
    stages = [(e.role, e.stage) for e in log.created(mark) if e.role != "check"]
    assert stages == [
        ("stage", "uninstall"),
        ("stage", "apply"),
        ("stage", "config"),
        ("interrupt", "interrupt"),
        ("stage", "post-interrupt"),
    ]
    rec = (await _executor(kapi, "gpu-00", "back")).packages["tuning"]
    assert (rec.installed, rec.cycle, rec.state) == ("1.0.0", "install", "succeeded")
