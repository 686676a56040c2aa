"""Packages run for real: on the rig's real node (containerd 2.x + kubelet), the agent in a
real container, the package image mounted as an image volume (or copied in by init
containers), changing the node's throwaway host root.

The example package is the one `make images` builds with buildah from
examples/packages/sysctl-tuning/Containerfile, exactly as docs/packages.md tells a user to;
other packages are built in the test as OCI archives (``nodewright.package_image``) and loaded
into the node's containerd, as a registry pull would. The services run as processes against
the rig, as in every e2e test; only the pods are real.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from nodewright import manifests, package_image
from nodewright.rig import Rig
from nodewright.rig.realnode import PAUSE_IMAGE, RealNode
from shared import api, pods, progress
from shared.events import Reason
from shared.kube import ApiError, Kube, path_of
from shared.records.executor import ExecutorRecord
from tests.e2e.conftest import NODES, Services, read_cr
from tests.helpers.cli import cli
from tests.helpers.podlog import pod_log
from tests.helpers.waiting import Pending, eventually

pytestmark = pytest.mark.timeout(600)

EXAMPLE_DIR = Path(__file__).resolve().parents[3] / "examples" / "packages" / "sysctl-tuning"
EXAMPLE_IMAGE = "ghcr.io/nvidia/nodewright-packages/sysctl-tuning"
TARGET = {"nodepool": "real"}
SYSCTL_A = "vm.swappiness = 10\nnet.core.somaxconn = 4096\n"
SYSCTL_B = "vm.swappiness = 20\nnet.core.somaxconn = 4096\n"
DEST = "etc/sysctl.d/90-nodewright-sysctl-tuning.conf"


def _cr(name: str, packages: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": TARGET},
            "interruptionBudget": {"count": 1},
            "packages": packages,
            **spec,
        },
    }


def _sysctl(version: str, config: str, **extra: Any) -> dict[str, Any]:
    return {
        "sysctl-tuning": {
            "version": version,
            "image": EXAMPLE_IMAGE,
            "configMap": {"sysctl.conf": config},
            **extra,
        }
    }


async def _wait_ready(kapi: Kube, name: str, what: str, timeout_s: float = 240) -> api.NodeWright:
    async def ready() -> api.NodeWright | Pending:
        cr = await read_cr(kapi, name)
        cond = next((c for c in cr.status.conditions if c.type == "Ready"), None)
        if (
            cond is not None
            and cond.status == "True"
            and cr.status.observed_generation == cr.metadata.generation
        ):
            return cr
        said = f"{cond.status}: {cond.message}" if cond else "no condition"
        return Pending(f"Ready={said}; details {cr.status.node_details}")

    return await eventually(ready, timeout_s=timeout_s, interval_s=0.5, what=what)


async def _executor(kapi: Kube, node: str, cr: str) -> ExecutorRecord:
    """The executor's record as the services read it (a cycle ends with its last check)."""
    return progress.facts(await kapi.get(f"{NODES}/{node}"), cr).executor


def _machine_swappiness() -> str:
    """This machine's own value, which no test may change."""
    return Path("/proc/sys/vm/swappiness").read_text().strip()


def _host(node: RealNode, path: str) -> Path:
    return node.host_root / path.lstrip("/")


def _live(node: RealNode, key: str) -> str:
    return _host(node, f"/proc/sys/{key.replace('.', '/')}").read_text().strip()


def _logs(node: RealNode, cr: str, package: str, version: str, mode: str) -> str:
    """Everything the agent logged for ``mode`` on the host (its step log files)."""
    root = _host(node, f"/var/log/nodewright/{cr}/{package}/{version}/{mode}")
    return "".join(p.read_text() for p in sorted(root.rglob("*.log"))) if root.is_dir() else ""


def _exists(path: Path) -> bool:
    return path.exists()


def _running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _process(pid: int) -> tuple[bytes, int]:
    """A process of this machine: its command line and its network namespace."""
    return Path(f"/proc/{pid}/cmdline").read_bytes(), os.stat(f"/proc/{pid}/ns/net").st_ino


def _package(
    tmp: Path, name: str, version: str, *, stages: dict[str, Any], steps: dict[str, str]
) -> Path:
    d = tmp / f"{name}-{version}"
    (d / "steps").mkdir(parents=True)
    (d / "config.json").write_text(
        json.dumps({"schema_version": "v1", "name": name, "version": version, "stages": stages})
    )
    for file, body in steps.items():
        (d / "steps" / file).write_text(body)
        (d / "steps" / file).chmod(0o755)
    return d


async def _load(node: RealNode, package_dir: Path, ref: str, tmp: Path) -> None:
    archive = tmp / (ref.replace("/", "_").replace(":", "_") + ".tar")
    package_image.build_archive(package_dir, ref=ref, out=archive)
    assert package_image.validate(str(archive)) == []
    await asyncio.to_thread(node.import_archive, archive)


OK_SH = "#!/bin/sh\nexit 0\n"


async def _one_step(
    node: RealNode, tmp: Path, name: str, step: str, check: str = OK_SH, *, image: str = ""
) -> str:
    """Package ``name`` 1.0.0, an apply stage of one step (the script ``step``) and its check,
    built and loaded into ``node``'s containerd as ``registry.example/<image or name>``; that
    image (without the version)."""
    stages = {
        "apply": {
            "steps": [{"name": name, "path": f"{name}.sh"}],
            "check": [{"name": "ok", "path": "ok.sh"}],
        }
    }
    pkg = _package(tmp, name, "1.0.0", stages=stages, steps={f"{name}.sh": step, "ok.sh": check})
    ref = f"registry.example/{image or name}"
    await _load(node, pkg, f"{ref}:1.0.0", tmp)
    return ref


async def _pid_written(node: RealNode, path: str, timeout_s: float) -> int:
    """The process ID a step wrote to ``path`` on the host (``echo $$``), once it did."""
    said = _host(node, path)

    async def written() -> int | Pending:
        text = said.read_text().strip() if said.exists() else ""
        return int(text) if text else Pending("the step has not started")

    return await eventually(written, timeout_s=timeout_s, interval_s=0.2, what="the step to start")


async def test_the_example_package_installs_reconfigures_and_upgrades_for_real(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    kapi, ns, node = cluster, services.namespace, real_node.name
    await asyncio.to_thread(services.fleet.start_all)
    before = {"swappiness": _machine_swappiness()}
    async with pod_log(kapi, ns) as log:
        await manifests.apply(kapi, _cr("tune", _sysctl("1.0.0", SYSCTL_A)))
        await _wait_ready(kapi, "tune", "the example installed on the real node")
        # The package changed the host root, not this machine.
        assert _host(real_node, DEST).read_text().splitlines()[1:] == [
            "vm.swappiness = 10",
            "net.core.somaxconn = 4096",
        ]
        assert _live(real_node, "vm.swappiness") == "10"
        assert _machine_swappiness() == before["swappiness"]
        # Its steps and its checks really ran, in real containers on the node.
        assert "setting vm.swappiness = 10" in _logs(
            real_node, "tune", "sysctl-tuning", "1.0.0", "apply"
        )
        assert "ok: vm.swappiness = 10" in _logs(
            real_node, "tune", "sysctl-tuning", "1.0.0", "apply-check"
        )
        rec = (await _executor(kapi, node, "tune")).packages["sysctl-tuning"]
        assert (rec.version, rec.installed) == ("1.0.0", "1.0.0")
        stages_1 = [(e.role, e.stage) for e in log.created(node=node)]
        assert stages_1[:2] == [("stage", "apply"), ("check", "apply")], stages_1

        # A config change runs only the config stage (and its check) again.
        mark = len(log.events)
        await kapi.patch(
            f"{manifests.NODEWRIGHTS}/tune", {"spec": {"packages": _sysctl("1.0.0", SYSCTL_B)}}
        )
        await _wait_ready(kapi, "tune", "the config change applied")
        assert sorted({(e.role, e.stage) for e in log.created(mark, node=node)}) == [
            ("check", "config"),
            ("stage", "config"),
        ]
        assert _live(real_node, "vm.swappiness") == "20"

        # A version bump upgrades: the package has no upgrade stage, so the agent runs the
        # new version's apply steps.
        bumped = tmp_path / "sysctl-tuning"
        shutil.copytree(EXAMPLE_DIR, bumped)
        config = json.loads((bumped / "config.json").read_text())
        (bumped / "config.json").write_text(json.dumps({**config, "version": "1.0.1"}))
        await _load(real_node, bumped, f"{EXAMPLE_IMAGE}:1.0.1", tmp_path)
        mark = len(log.events)
        await kapi.patch(
            f"{manifests.NODEWRIGHTS}/tune", {"spec": {"packages": _sysctl("1.0.1", SYSCTL_B)}}
        )
        await _wait_ready(kapi, "tune", "the upgrade to 1.0.1")
        assert ("stage", "upgrade") in [(e.role, e.stage) for e in log.created(mark, node=node)]
        rec = (await _executor(kapi, node, "tune")).packages["sysctl-tuning"]
        assert (rec.version, rec.installed) == ("1.0.1", "1.0.1")
        assert (
            "Managed by NodeWright package sysctl-tuning 1.0.1"
            in _host(real_node, DEST).read_text()
        )
    raw = await kapi.get(f"{NODES}/{node}")
    assert not raw["spec"].get("unschedulable"), "uncordoned at the end"


async def test_an_explicit_uninstall_removes_the_files_and_restores_the_values(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode
) -> None:
    kapi = cluster
    await asyncio.to_thread(services.fleet.start_all)
    original = _live(real_node, "vm.swappiness")
    packages = _sysctl("1.0.0", SYSCTL_A, uninstall={"enabled": True})
    await manifests.apply(kapi, _cr("tune-u", packages))
    await _wait_ready(kapi, "tune-u", "the example installed")
    assert _host(real_node, DEST).exists()
    requested = _sysctl("1.0.0", SYSCTL_A, uninstall={"enabled": True, "requested": True})
    await kapi.patch(f"{manifests.NODEWRIGHTS}/tune-u", {"spec": {"packages": requested}})
    await _wait_ready(kapi, "tune-u", "the uninstall")
    assert not _host(real_node, DEST).exists()
    assert _live(real_node, "vm.swappiness") == original
    assert "verify-removed" in "".join(
        p.name for p in _host(real_node, "/var/log/nodewright/tune-u").rglob("*") if p.is_dir()
    )
    # Nothing of it is tracked on the node any more.
    assert "sysctl-tuning" not in (await _executor(kapi, real_node.name, "tune-u")).packages


async def _failure(kapi: Kube, cr: str, node: str, package: str) -> Reason:
    """The reason the executor recorded for ``package`` failing on ``node`` (what the CR's
    node details, Events and ``nodewright node status`` show)."""

    async def failed() -> Reason | Pending:
        rec = (await _executor(kapi, node, cr)).packages.get(package)
        if rec is not None and rec.state == "failed" and rec.reason is not None:
            return rec.reason
        obj = await read_cr(kapi, cr)
        return Pending(f"record {rec}; node details {obj.status.node_details}")

    return await eventually(failed, timeout_s=180, what=f"{package} to fail on {node} in {cr}")


async def test_a_failing_step_reports_its_real_exit_code_and_output(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    kapi, node = cluster, real_node.name
    stages = {
        "apply": {
            "steps": [{"name": "boom", "path": "boom.sh"}],
            "check": [{"name": "c", "path": "ok.sh"}],
        }
    }
    boom = "#!/bin/sh\necho 'writing the settings'\necho 'disk full' >&2\nexit 7\n"
    steps = {"boom.sh": boom, "ok.sh": "#!/bin/sh\nexit 0\n"}
    pkg = _package(tmp_path, "boom", "1.0.0", stages=stages, steps=steps)
    await _load(real_node, pkg, "registry.example/boom:1.0.0", tmp_path)
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(
        kapi, _cr("boom", {"boom": {"version": "1.0.0", "image": "registry.example/boom"}})
    )
    reason = await _failure(kapi, "boom", node, "boom")
    assert reason.code == "StageFailed"
    assert reason.details["exitCode"] == "1"  # the agent's exit code for a failed step
    assert reason.details["failedStep"] == "boom"
    print(reason.message)
    assert "(boom.sh) exited with 7" in reason.message  # the step's own, real exit code
    assert "disk full" in reason.message  # its output's tail

    # The status service reports it on its next pass (events nudge it; nothing waits for it).
    async def failed_in_status() -> api.NodeDetail | Pending:
        cr = await read_cr(kapi, "boom")
        detail = next((d for d in cr.status.node_details if d.node == node), None)
        if detail is not None and (detail.state, detail.reason) == ("Failed", "StageFailed"):
            return detail
        return Pending(f"{detail}")

    detail = await eventually(failed_in_status, what="the status to show the failed node")
    assert "exited with 7" in detail.message
    # The pod is kept after its failure; its real log is readable through the API server.
    done = await cli(
        rig,
        "package",
        "logs",
        "boom",
        "--node",
        node,
        "--nodewright",
        "boom",
        "-n",
        services.namespace,
    )
    assert done.code == 0, done.err
    # The agent's events as a person reads them (docs/cli.md "Package logs"), not JSON.
    lines = done.out.splitlines()
    assert any(line.endswith("Z [boom] writing the settings") for line in lines), done.out
    assert any(line.endswith("Z [boom] stderr: disk full") for line in lines), done.out
    assert any("[boom] FAILED: step 'boom' (boom.sh) exited with 7" in x for x in lines), done.out
    assert not any(line.startswith("{") for line in lines), done.out
    raw = await cli(
        rig, "package", "logs", "boom", "--node", node, "--nodewright", "boom", "--raw",
        "-n", services.namespace,
    )  # fmt: skip
    assert raw.code == 0, raw.err
    said = [json.loads(x) for x in raw.out.splitlines() if x.startswith("{")]
    assert {"step": "boom", "stream": "stderr", "line": "disk full"}.items() <= next(
        e for e in said if e.get("event") == "step.output" and e.get("stream") == "stderr"
    ).items()


async def test_steps_and_checks_read_the_nodes_metadata_from_their_pod(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """docs/packages.md "Node metadata" on a real kubelet: the pod's own annotation, mounted
    with the downward API, staged by the agent on the host, read by a step and a check."""
    kapi, node = cluster, real_node.name
    model = "NVIDIA-A100-SXM4-80GB"
    await kapi.patch(
        f"{NODES}/{node}",
        {"metadata": {"labels": {"nvidia.com/gpu.product": model}}},
    )
    stages = {
        "apply": {
            "steps": [{"name": "keep", "path": "keep.sh"}],
            "check": [{"name": "model", "path": "model.sh"}],
        }
    }
    meta = '"$NODEWRIGHT_NODE_METADATA_DIR/node.json"'
    keep = f"#!/bin/sh\nset -e\nmkdir -p /etc/meta\ncp {meta} /etc/meta/\n"
    check = f'#!/bin/sh\ngrep -q \'"nvidia.com/gpu.product": "{model}"\' {meta}\n'
    pkg = _package(
        tmp_path, "meta", "1.0.0", stages=stages, steps={"keep.sh": keep, "model.sh": check}
    )
    await _load(real_node, pkg, "registry.example/meta:1.0.0", tmp_path)
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(
        kapi, _cr("meta", {"meta": {"version": "1.0.0", "image": "registry.example/meta"}})
    )
    await _wait_ready(kapi, "meta", "the package that reads the node's metadata")

    seen = json.loads(_host(real_node, "/etc/meta/node.json").read_text())
    assert seen["name"] == node
    assert seen["labels"]["nvidia.com/gpu.product"] == model
    assert seen["nodewright"] == "meta"
    assert seen["packages"] == {
        "meta": {"name": "meta", "version": "1.0.0", "image": "registry.example/meta:1.0.0"}
    }
    assert not any(k.startswith("nodewright.nvidia.com/") for k in seen["annotations"])
    # The check ran against the same file (it fails without the label: nothing to pass it).
    assert (await _executor(kapi, node, "meta")).packages["meta"].installed == "1.0.0"


async def test_steps_change_the_nodes_own_network_not_one_of_the_pods(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """A package that tunes the network (net.* sysctls, iptables, links) must change the
    node's: its step runs in the network namespace the node's kubelet runs in, not in one
    the pod got for itself (the rig's host root fakes /proc/sys, so only the namespace the
    step ran in can tell)."""
    kapi = cluster
    # The step says who it is, then waits until the test has looked at it.
    where = (
        "#!/bin/sh\necho $$ > /etc/nw-step.pid\ni=0\n"
        "while [ ! -e /etc/nw-step.seen ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done\n"
    )
    image = await _one_step(real_node, tmp_path, "where", where)
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr("where", {"where": {"version": "1.0.0", "image": image}}))
    pid = await _pid_written(real_node, "/etc/nw-step.pid", timeout_s=180)
    try:
        command, step_net = _process(pid)
        assert b"where.sh" in command, "with hostPID, the step's $$ is its process here"
        node_net = _process(real_node.holder_pid)[1]
    finally:
        _host(real_node, "/etc/nw-step.seen").write_text("")
    assert step_net == node_net, "the step ran in a network namespace of the pod's own"
    await _wait_ready(kapi, "where", "the package that looked at its network")


async def test_a_missing_step_file_is_named_before_anything_runs(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    kapi, node = cluster, real_node.name
    stages = {
        "apply": {
            "steps": [{"name": "typo", "path": "confgi.sh"}],
            "check": [{"name": "c", "path": "ok.sh"}],
        }
    }
    pkg = _package(tmp_path, "typo", "1.0.0", stages=stages, steps={"ok.sh": "#!/bin/sh\nexit 0\n"})
    # What `nodewright package validate` would have said before publishing.
    (problem,) = package_image.validate(str(pkg))
    assert "confgi.sh: file not found" in problem
    archive = tmp_path / "typo.tar"
    package_image.build_archive(pkg, ref="registry.example/typo:1.0.0", out=archive)
    await asyncio.to_thread(real_node.import_archive, archive)
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(
        kapi, _cr("typo", {"typo": {"version": "1.0.0", "image": "registry.example/typo"}})
    )
    reason = await _failure(kapi, "typo", node, "typo")
    assert reason.details["exitCode"] == "3"  # an invalid package: nothing ran
    assert "/nodewright-package/steps/confgi.sh: file not found" in reason.message
    assert "{" not in reason.message, "the agent's result is read, not quoted"


async def test_copy_staging_runs_the_package_without_image_volumes(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode
) -> None:
    """``packageStaging: copy``: two init containers copy the package image's files into the
    pod (with the agent image's static busybox; the package image has no shell)."""
    kapi, ns = cluster, services.namespace
    services.fleet.extra_env["NODEWRIGHT_PODS_PACKAGE_STAGING"] = "copy"
    await asyncio.to_thread(services.fleet.start_all)
    seen: list[dict[str, Any]] = []

    async def stage_pod() -> bool:
        listed = await kapi.get(
            path_of(plural="pods", namespace=ns), labelSelector=pods.selector("stage")
        )
        seen.extend(listed["items"])
        return bool(listed["items"])

    await manifests.apply(kapi, _cr("copy", _sysctl("1.0.0", SYSCTL_A)))
    await eventually(stage_pod, what="a stage pod")
    spec = seen[0]["spec"]
    # The package's files are copied first, then apply, its check and config run; config's
    # check is the pod's main container.
    assert [c["name"] for c in spec["initContainers"]] == [
        "stage-tools",
        "stage-package",
        "apply",
        "apply-check",
        "config",
    ]
    assert [c["name"] for c in spec["containers"]] == ["config-check"]
    assert not any("image" in v for v in spec["volumes"])
    await _wait_ready(kapi, "copy", "the example installed by copy staging")
    assert _live(real_node, "vm.swappiness") == "10"
    assert "ok: vm.swappiness = 10" in _logs(
        real_node, "copy", "sysctl-tuning", "1.0.0", "apply-check"
    )


async def test_a_runtime_without_image_volumes_names_the_setting_and_copy_staging_recovers(
    rig: Rig, cluster: Kube, services: Services, legacy_node: RealNode
) -> None:
    """real-2 runs Debian's containerd 1.6, which cannot mount images as volumes: the node
    fails at once saying so and naming ``packageStaging: copy``; setting it (as ``helm
    upgrade --set packageStaging=copy`` would: executor and validator restarted with it)
    and retrying the node, as docs/packages.md says, installs the package."""
    kapi, node = cluster, legacy_node.name
    await asyncio.to_thread(services.fleet.start_all)
    cr = _cr("legacy", _sysctl("1.0.0", SYSCTL_A))
    cr["spec"]["nodeSelectors"] = {"matchLabels": {"nodepool": "legacy"}}
    await manifests.apply(kapi, cr)
    reason = await _failure(kapi, "legacy", node, "sysctl-tuning")
    assert reason.code == "ImageVolumeUnsupported"
    assert "set packageStaging: copy" in reason.message
    assert reason.details["setting"] == "packageStaging: copy"

    async def unsupported_in_status() -> api.NodeDetail | Pending:
        cr = await read_cr(kapi, "legacy")
        found = next((d for d in cr.status.node_details if d.node == node), None)
        if found is not None and found.reason == "ImageVolumeUnsupported":
            return found
        return Pending(f"{found}")

    # The status service reports it on its next pass.
    detail = await eventually(unsupported_in_status, what="the status to show the reason")
    assert detail.reason == "ImageVolumeUnsupported"

    fleet = services.fleet
    fleet.extra_env["NODEWRIGHT_PODS_PACKAGE_STAGING"] = "copy"
    for service in ("executor", "validator"):
        await asyncio.to_thread(fleet.kill, service)
        await asyncio.to_thread(fleet.start, service)
    done = await cli(rig, "node", "retry", node, "--nodewright", "legacy")
    assert done.code == 0, done.err
    await _wait_ready(kapi, "legacy", "the package on containerd 1.6 with copy staging")
    assert _live(legacy_node, "vm.swappiness") == "10"
    assert "ok: vm.swappiness = 10" in _logs(
        legacy_node, "legacy", "sysctl-tuning", "1.0.0", "apply-check"
    )


async def test_a_package_image_that_cannot_be_pulled_fails_the_node_naming_it(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode
) -> None:
    """The kubelet cannot pull the package image (no registry serves it): the stage fails
    with ImagePullFailed naming the image, once the pull grace is over, not at the stage's
    timeout; the image is mounted as a volume, whose pull a real kubelet reports."""
    kapi, node = cluster, real_node.name
    services.fleet.extra_env["NODEWRIGHT_PODS_IMAGE_PULL_GRACE_S"] = "5"
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(
        kapi, _cr("nowhere", {"nowhere": {"version": "1.0.0", "image": "registry.example/nowhere"}})
    )
    reason = await _failure(kapi, "nowhere", node, "nowhere")
    assert reason.code == "ImagePullFailed", reason
    assert reason.details["image"] == "registry.example/nowhere:1.0.0"
    assert "registry.example/nowhere:1.0.0" in reason.message


def _push(rig: Rig, package_dir: Path, ref: str, tmp: Path) -> None:
    """Build ``package_dir`` as an image and push it to the rig's registry as ``ref``, as a
    user pushes to theirs (the image is on no node until one pulls it)."""
    archive, layout = tmp / "image.tar", tmp / "image-layout"
    package_image.build_archive(package_dir, ref=ref, out=archive)
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="data")
    crane = str(rig.bin_dir / "crane")
    subprocess.run([crane, "push", "--insecure", str(layout), ref], check=True, timeout=60)


@pytest.mark.parametrize(
    ("node_fixture", "pool", "staging"),
    [
        ("real_node", "real", "image-volume"),
        ("real_node", "real", "copy"),
        ("legacy_node", "legacy", "copy"),
    ],
    ids=["containerd-2-image-volume", "containerd-2-copy", "containerd-1.6-copy"],
)
async def test_a_package_pushed_to_the_rigs_registry_is_pulled_by_the_node_and_runs(
    node_fixture: str,
    pool: str,
    staging: str,
    request: pytest.FixtureRequest,
    rig: Rig,
    cluster: Kube,
    services: Services,
    tmp_path: Path,
) -> None:
    """As on a cluster, the package image is in a registry, not on the node: the node's
    containerd (2.x, and 1.6 through its own configuration) pulls it from the rig's registry
    (docs/packages.md "Trying a package on a real node"), as an image volume or as the
    container that copies the package in."""
    kapi, node = cluster, request.getfixturevalue(node_fixture)
    assert isinstance(node, RealNode)
    assert rig.registry is not None
    mark = "#!/bin/sh\necho pulled > /etc/nw-pulled-$NODEWRIGHT_CR\n"
    check = '#!/bin/sh\ngrep -qx pulled "/etc/nw-pulled-$NODEWRIGHT_CR"\n'
    stages = {
        "apply": {
            "steps": [{"name": "mark", "path": "mark.sh"}],
            "check": [{"name": "marked", "path": "marked.sh"}],
        }
    }
    pkg = _package(
        tmp_path, "pulled", "1.0.0", stages=stages, steps={"mark.sh": mark, "marked.sh": check}
    )
    cr = f"pulled-{request.node.callspec.id}".replace(".", "-")
    image = f"{rig.registry}/packages/{cr}"
    await asyncio.to_thread(_push, rig, pkg, f"{image}:1.0.0", tmp_path)
    assert f"{image}:1.0.0" not in node.ctr("images", "list", "-q").split()
    services.fleet.extra_env["NODEWRIGHT_PODS_PACKAGE_STAGING"] = staging
    await asyncio.to_thread(services.fleet.start_all)
    spec = _cr(cr, {"pulled": {"version": "1.0.0", "image": image}})
    spec["spec"]["nodeSelectors"] = {"matchLabels": {"nodepool": pool}}
    await manifests.apply(kapi, spec)
    await _wait_ready(kapi, cr, "the package pulled from the rig's registry")
    assert _host(node, f"/etc/nw-pulled-{cr}").read_text() == "pulled\n"
    assert f"{image}:1.0.0" in node.ctr("images", "list", "-q").split()


async def test_a_packages_env_reaches_its_steps_and_a_missing_secret_is_named(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """``spec.packages[].env`` on a real kubelet: a variable whose Secret does not exist yet
    keeps the container from being created (CreateContainerConfigError, which only a real
    kubelet gives): the node fails naming the Secret once the grace is over; with the Secret
    made and the node retried, the step reads both variables."""
    kapi, node = cluster, real_node.name
    env_sh = '#!/bin/sh\nprintf \'%s|%s\\n\' "$GREETING" "$TOKEN" > /etc/envy.txt\n'
    image = await _one_step(real_node, tmp_path, "envy", env_sh)
    services.fleet.extra_env["NODEWRIGHT_PODS_IMAGE_PULL_GRACE_S"] = "5"
    await asyncio.to_thread(services.fleet.start_all)
    secret_ref = {"secretKeyRef": {"name": "envy-secret", "key": "token"}}
    package = {
        "version": "1.0.0",
        "image": image,
        "env": [{"name": "GREETING", "value": "hello"}, {"name": "TOKEN", "valueFrom": secret_ref}],
    }
    await manifests.apply(kapi, _cr("envy", {"envy": package}))

    reason = await _failure(kapi, "envy", node, "envy")
    assert reason.code == "ContainerCreateFailed", reason
    assert reason.details["waitingReason"] == "CreateContainerConfigError"
    assert 'secret "envy-secret" not found' in reason.message

    await kapi.create(
        path_of(plural="secrets", namespace=services.namespace),
        {"metadata": {"name": "envy-secret"}, "stringData": {"token": "s3cret"}},
    )
    done = await cli(rig, "node", "retry", node, "--nodewright", "envy")
    assert done.code == 0, done.err
    await _wait_ready(kapi, "envy", "the package that reads its env")
    assert _host(real_node, "/etc/envy.txt").read_text() == "hello|s3cret\n"


async def _stopped_pod(kapi: Kube, ns: str, cr: str) -> dict[str, Any]:
    """The one pod of ``cr``, once the kubelet ended it for the deadline the executor set
    (a stage that timed out or was aborted): kept, for its logs."""

    async def ended() -> dict[str, Any] | Pending:
        listed = await kapi.get(path_of(plural="pods", namespace=ns))
        ours = [p for p in listed["items"] if p["metadata"]["labels"].get(pods.LABEL_CR) == cr]
        phases = [(p["status"].get("phase"), p["status"].get("reason")) for p in ours]
        if len(ours) == 1 and phases[0] == ("Failed", "DeadlineExceeded"):
            return dict(ours[0])
        return Pending(f"pods {phases}")

    return await eventually(ended, timeout_s=60, what=f"the stopped pod of {cr}, kept")


async def test_a_stage_past_its_timeout_fails_and_its_step_stops_on_the_host(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """A step that hangs: the stage fails with StageTimeout, and the step's process (the
    host's, with hostPID) is stopped with its pod, within gracefulShutdownSeconds, not left
    running after the failure; the pod is kept, ended, for its logs."""
    kapi, node = cluster, real_node.name
    hang = "#!/bin/sh\necho $$ > /etc/hang.pid\nexec sleep 3600\n"
    image = await _one_step(real_node, tmp_path, "hang", hang)
    await asyncio.to_thread(services.fleet.start_all)
    package = {
        "version": "1.0.0",
        "image": image,
        "stageTimeoutSeconds": 10,
        "gracefulShutdownSeconds": 5,
    }
    await manifests.apply(kapi, _cr("hang", {"hang": package}))

    pid = await _pid_written(real_node, "/etc/hang.pid", timeout_s=120)
    assert b"sleep" in _process(pid)[0], "the step's own process, seen on the host"
    reason = await _failure(kapi, "hang", node, "hang")
    assert reason.code == "StageTimeout", reason
    assert reason.details["timeoutSeconds"] == "10"

    async def stopped() -> bool:
        return not _running(pid)

    await eventually(stopped, timeout_s=30, interval_s=0.5, what="the hung step to be stopped")
    pod = await _stopped_pod(kapi, services.namespace, "hang")
    logs = await cli(rig, "package", "logs", "hang", "--node", node, "-n", services.namespace)
    assert logs.code == 0, logs.err
    assert f"==> pod {pod['metadata']['name']}" in logs.out, "kept for what it printed"


async def test_node_abort_stops_a_hung_stage_now_keeps_its_logs_and_retry_runs_it_again(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """A step hangs and its timeout is the default half hour. ``nodewright node abort``
    fails the stage at once (StageAborted), the kubelet stops its pod (the step's process
    on the host with it) and the pod stays, so ``nodewright package logs`` still prints
    what the step said; ``nodewright node retry`` runs it again and the rollout completes.
    The services run as their own ServiceAccounts: the chart's RBAC lets the executor stop
    a pod."""
    kapi, node, ns = cluster, real_node.name, services.namespace
    hang = (
        "#!/bin/sh\n"
        "if [ -e /etc/abort.once ]; then echo 'second run, done'; exit 0; fi\n"
        "touch /etc/abort.once\necho $$ > /etc/abort.pid\necho 'waiting for a lock'\n"
        "exec sleep 3600\n"
    )
    image = await _one_step(real_node, tmp_path, "hang", hang)
    services.fleet.rbac = True
    await asyncio.to_thread(services.fleet.start_all)
    package = {"version": "1.0.0", "image": image, "gracefulShutdownSeconds": 5}
    await manifests.apply(kapi, _cr("abort", {"hang": package}))
    pid = await _pid_written(real_node, "/etc/abort.pid", timeout_s=120)
    assert b"sleep" in _process(pid)[0], "the step's own process, seen on the host"

    nothing = await cli(rig, "node", "abort", node, "--nodewright", "abort", "--package", "nope")
    assert (nothing.code, nothing.out) == (1, ""), nothing
    assert "no package nope has run on node" in nothing.err
    asked = await cli(rig, "node", "abort", node)
    assert asked.code == 0, asked.err
    assert f"Requested abort #1 of NodeWright abort on node {node}" in asked.out, asked.out
    assert "package hang 1.0.0 stage apply (attempt 1) fails" in asked.out, asked.out

    reason = await _failure(kapi, "abort", node, "hang")
    assert reason.code == "StageAborted", reason
    assert "nodewright node retry" in reason.message

    async def stopped() -> bool:
        return not _running(pid)

    await eventually(stopped, timeout_s=30, interval_s=0.5, what="the hung step to be stopped")

    pod = await _stopped_pod(kapi, ns, "abort")
    logs = await cli(rig, "package", "logs", "hang", "--node", node, "-n", ns)
    assert logs.code == 0, logs.err
    assert "waiting for a lock" in logs.out, logs.out
    again = await cli(rig, "node", "abort", node)
    assert (again.code, again.err) == (0, ""), again
    assert f"NodeWright abort on node {node}: nothing runs, nothing to abort." in again.out
    named = await cli(rig, "node", "abort", node, "--nodewright", "abort")
    assert named.code == 1, named
    assert f"nodewright: nothing runs for NodeWright abort on {node}" in named.err, named.err

    retried = await cli(rig, "node", "retry", node)
    assert retried.code == 0, retried.err
    await _wait_ready(kapi, "abort", "the retried stage to complete")
    rec = (await _executor(kapi, node, "abort")).packages["hang"]
    assert (rec.installed, rec.attempt, rec.reason) == ("1.0.0", 2, None)

    async def dropped() -> bool:
        listed = await kapi.get(path_of(plural="pods", namespace=ns))
        return pod["metadata"]["name"] not in {p["metadata"]["name"] for p in listed["items"]}

    await eventually(dropped, timeout_s=60, what="the retry to drop the aborted attempt's pod")


async def test_a_hung_stage_starts_over_at_once_when_its_image_is_fixed(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """A step hangs (the package's bug). Its fix is pushed as a new image of the same version
    and the CR's image changed to it: the hung step is stopped on the host and the stage runs
    again with the fixed image at once, not after its timeout (the default hour)."""
    kapi, node = cluster, real_node.name
    hang = "#!/bin/sh\necho $$ > /etc/stuck.pid\nexec sleep 3600\n"
    image = await _one_step(real_node, tmp_path, "stuck", hang)
    step = "#!/bin/sh\necho fixed > /etc/stuck.fixed\n"
    fixed = await _one_step(real_node, tmp_path / "fixed", "stuck", step, image="stuck-fixed")
    await asyncio.to_thread(services.fleet.start_all)
    package = {"version": "1.0.0", "image": image, "gracefulShutdownSeconds": 5}
    await manifests.apply(kapi, _cr("stuck", {"stuck": package}))
    pid = await _pid_written(real_node, "/etc/stuck.pid", timeout_s=120)
    assert b"sleep" in _process(pid)[0], "the step's own process, seen on the host"

    fix = {"packages": {"stuck": {"image": fixed}}}
    await kapi.patch(f"{manifests.NODEWRIGHTS}/stuck", {"spec": fix})

    async def stopped() -> bool:
        return not _running(pid)

    await eventually(stopped, timeout_s=60, interval_s=0.5, what="the hung step to be stopped")
    await _wait_ready(kapi, "stuck", "the stage run again with the fixed image")
    assert _host(real_node, "/etc/stuck.fixed").read_text() == "fixed\n"
    rec = (await _executor(kapi, node, "stuck")).packages["stuck"]
    assert (rec.installed, rec.attempt, rec.reason) == ("1.0.0", 2, None)


async def test_package_logs_follow_prints_a_running_step_as_it_writes_then_its_check(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """``nodewright package logs -f`` on a real kubelet: the step's lines arrive while it
    still runs, then its check's (the next container of the same pod), and the command ends
    by itself once the pod has."""
    kapi, node = cluster, real_node.name
    tick = (
        '#!/bin/sh\ni=1\nwhile [ $i -le 6 ]; do echo "tick $i"; sleep 1; i=$((i+1)); done\n'
        "touch /etc/ticked\n"
    )
    image = await _one_step(
        real_node, tmp_path, "ticker", tick, check="#!/bin/sh\necho 'checked the ticks'\n"
    )
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr("ticker", {"ticker": {"version": "1.0.0", "image": image}}))
    ticked = _host(real_node, "/etc/ticked")

    async def running() -> bool:
        listed = await kapi.get(path_of(plural="pods", namespace=services.namespace))
        return any(
            s.get("name") == "apply" and "running" in (s.get("state") or {})
            for p in listed["items"]
            for s in (p.get("status") or {}).get("initContainerStatuses") or ()
        )

    await eventually(running, timeout_s=120, interval_s=0.2, what="the step to run")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nodewright.cli", "package", "logs", "ticker", "--node", node,
        "-f", "-n", services.namespace, "--kubeconfig", str(rig.endpoints.kubeconfig),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        first = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert not _exists(ticked), "a line printed while the step still ran"
        lines.append(first.decode())
        rest, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
    lines += rest.decode().splitlines(keepends=True)
    text = "".join(lines)
    assert proc.returncode == 0, err.decode()
    assert [f"tick {i}" in text for i in range(1, 7)] == [True] * 6, text
    assert "checked the ticks" in text, text


async def test_depends_on_runs_a_package_after_its_dependency_is_installed_on_the_host(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """``app`` depends on ``base``; ``solo`` depends on nothing. On a real node: app's step
    finds what base's step left on the host (base takes 4 s to leave it; app fails without
    it), and solo ran while base was still at work. Each step writes the host's clock when
    it ran."""
    kapi, node = cluster, real_node.name
    stamp = 'date +%s.%N > "/etc/deps-$1"\n'
    base = "#!/bin/sh\nsleep 4\n" + stamp.replace("$1", "base")
    app = "#!/bin/sh\ntest -f /etc/deps-base || exit 3\n" + stamp.replace("$1", "app")
    solo = "#!/bin/sh\n" + stamp.replace("$1", "solo")
    images = {
        name: await _one_step(real_node, tmp_path / name, name, step)
        for name, step in (("base", base), ("app", app), ("solo", solo))
    }
    await asyncio.to_thread(services.fleet.start_all)
    packages: dict[str, Any] = {
        name: {"version": "1.0.0", "image": image} for name, image in images.items()
    }
    packages["app"]["dependsOn"] = {"base": "1.0.0"}
    await manifests.apply(kapi, _cr("deps", packages))
    await _wait_ready(kapi, "deps", "three packages, one depending on another")
    ran = {n: float(_host(real_node, f"/etc/deps-{n}").read_text()) for n in images}
    assert ran["base"] < ran["app"], ran
    assert ran["solo"] < ran["base"], f"solo waited for base: {ran}"
    rec = (await _executor(kapi, node, "deps")).packages
    assert {n: (r.installed, r.attempt) for n, r in rec.items()} == dict.fromkeys(
        images, ("1.0.0", 1)
    )


@pytest.mark.parametrize(
    ("node_fixture", "pool", "staging"),
    [("real_node", "real", "image-volume"), ("legacy_node", "legacy", "copy")],
    ids=["containerd-2-image-volume", "containerd-1.6-copy"],
)
async def test_pre_pulled_images_are_on_the_node_before_its_workload_is_evicted(
    node_fixture: str,
    pool: str,
    staging: str,
    request: pytest.FixtureRequest,
    rig: Rig,
    cluster: Kube,
    services: Services,
    tmp_path: Path,
) -> None:
    """``spec.drain.prePullImages`` on a real kubelet pulling from the rig's registry: one of
    two package images is not in the registry yet, so the drain fails with ImagePullFailed
    naming it, as the node's containerd reports it, while the node's workload keeps running;
    once it is pushed, ``nodewright node retry`` pulls it with a new pod, and only then is the
    workload evicted and the packages run, from images already on the node."""
    kapi, ns = cluster, services.namespace
    node = request.getfixturevalue(node_fixture)
    assert isinstance(node, RealNode)
    assert rig.registry is not None
    cr = f"prepull-{pool}"
    images = {n: f"{rig.registry}/packages/{cr}-{n}" for n in ("first", "second")}
    built = {}
    for sub in ("1", "2"):
        (tmp_path / sub).mkdir()
    for name in images:
        step = f"#!/bin/sh\necho {name} > /etc/nw-{cr}-{name}\n"
        stages = {
            "apply": {
                "steps": [{"name": name, "path": "s.sh"}],
                "check": [{"name": "ok", "path": "ok.sh"}],
            }
        }
        built[name] = _package(
            tmp_path, name, "1.0.0", stages=stages, steps={"s.sh": step, "ok.sh": OK_SH}
        )
    await asyncio.to_thread(_push, rig, built["first"], f"{images['first']}:1.0.0", tmp_path / "1")
    workload = {
        "metadata": {"name": f"work-{pool}"},
        "spec": {
            "nodeName": node.name,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": PAUSE_IMAGE, "imagePullPolicy": "IfNotPresent"}],
        },
    }
    created = await kapi.create(path_of(plural="pods", namespace=ns), workload)
    path = path_of(plural="pods", namespace=ns, name=f"work-{pool}")

    async def running() -> bool:
        return bool((await kapi.get(path)).get("status", {}).get("phase") == "Running")

    await eventually(running, timeout_s=60, what="the workload to run")
    services.fleet.extra_env["NODEWRIGHT_PODS_PACKAGE_STAGING"] = staging
    services.fleet.extra_env["NODEWRIGHT_DRAINER_IMAGE_PULL_GRACE_S"] = "5"
    await asyncio.to_thread(services.fleet.start_all)
    spec = _cr(
        cr,
        {n: {"version": "1.0.0", "image": image} for n, image in images.items()},
        drain={"prePullImages": True, "unmanagedPods": "Evict"},
    )
    spec["spec"]["nodeSelectors"] = {"matchLabels": {"nodepool": pool}}
    await manifests.apply(kapi, spec)

    async def pull_failed() -> Reason | Pending:
        facts = progress.facts(await kapi.get(f"{NODES}/{node.name}"), cr)
        if facts.drain is not None and facts.drain.phase == "failed" and facts.drain.reason:
            return facts.drain.reason
        return Pending(f"drain record {facts.drain}")

    reason = await eventually(pull_failed, timeout_s=120, what="the drain to fail on the pull")
    assert reason.code == "ImagePullFailed", reason
    assert reason.details["image"] == f"{images['second']}:1.0.0", reason
    assert "nothing was evicted" in reason.message
    still = await kapi.get(path)
    assert still["metadata"]["uid"] == created["metadata"]["uid"]
    assert still["status"]["phase"] == "Running"
    assert not still["metadata"].get("deletionTimestamp"), "the workload was not evicted"

    await asyncio.to_thread(
        _push, rig, built["second"], f"{images['second']}:1.0.0", tmp_path / "2"
    )
    done = await cli(rig, "node", "retry", node.name, "--nodewright", cr)
    assert done.code == 0, done.err
    await _wait_ready(kapi, cr, "the packages after their images were pulled")
    on_node = node.ctr("images", "list", "-q").split()
    assert {f"{image}:1.0.0" for image in images.values()} <= set(on_node)
    for name in images:
        assert _host(node, f"/etc/nw-{cr}-{name}").read_text() == f"{name}\n"
    with pytest.raises(ApiError) as gone:
        await kapi.get(path)
    assert gone.value.not_found, "evicted once the images were on the node"

    async def no_pull_pods() -> bool:
        listed = await kapi.get(
            path_of(plural="pods", namespace=ns), labelSelector=f"{pods.LABEL_ROLE}=pull"
        )
        return not listed["items"]

    await eventually(no_pull_pods, timeout_s=60, what="the pull pods to go")
