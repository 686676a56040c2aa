"""``make sandbox-real`` (``nodewright sandbox --real-node``) does what the README says: the
example package sysctl-tuning runs in real containers on one real node and changes that
node's throwaway host root, where the sandbox says to look; a package of one's own, built
and pushed to the registry the sandbox names as it says (docs/packages.md "Trying a package
on a real node"), is pulled by the node and runs; and Ctrl-C leaves nothing."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.e2e.test_sandbox import _nothing_left, _read_until, _rig_dirs, _sandbox

pytestmark = [pytest.mark.timeout(600), pytest.mark.rig]


def _changed(conf: str, swappiness: str, logs: str) -> tuple[str, str, list[Path]]:
    """The node's sysctl file, its (throwaway) vm.swappiness and the package's log files."""
    return (
        Path(conf).read_text(),
        Path(swappiness).read_text().strip(),
        [p for p in Path(logs).rglob("*") if p.is_file()],
    )


def _own_package(work: Path, registry: str, kubeconfig: str, kubectl: str) -> None:
    """Build a package with buildah and push it to ``registry`` as the sandbox says (with
    buildah's storage in ``work``, not the machine's), then apply a NodeWright for it."""
    pkg = work / "motd"
    (pkg / "steps").mkdir(parents=True)
    stages = {
        "apply": {
            "steps": [{"name": "write-motd", "path": "apply.sh"}],
            "check": [{"name": "verify-motd", "path": "check.sh"}],
        }
    }
    config = {"schema_version": "v1", "name": "motd", "version": "1.0.0", "stages": stages}
    (pkg / "config.json").write_text(json.dumps(config))
    (pkg / "steps" / "apply.sh").write_text("#!/bin/sh\necho own package > /etc/motd\n")
    (pkg / "steps" / "check.sh").write_text("#!/bin/sh\ngrep -qx 'own package' /etc/motd\n")
    (pkg / "Containerfile").write_text(
        "FROM scratch\nCOPY config.json /config.json\nCOPY steps/ /steps/\n"
    )
    ref = f"{registry}/motd:1.0.0"
    store = ["--root", str(work / "storage"), "--runroot", str(work / "run")]
    store += ["--storage-driver", "vfs"]
    for argv in (["bud", "-t", ref, str(pkg)], ["push", "--tls-verify=false", ref]):
        subprocess.run(["buildah", *store, *argv], check=True, capture_output=True, timeout=180)
    cr = {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "motd"},
        "spec": {
            "nodeSelectors": {"matchLabels": {"nodepool": "real"}},
            "packages": {"motd": {"version": "1.0.0", "image": f"{registry}/motd"}},
        },
    }
    subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "apply", "-f", "-"],
        input=json.dumps(cr).encode(),
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "wait", "--for=condition=Ready", "nodewright/motd",
         "--timeout=240s"],
        check=True,
        capture_output=True,
        timeout=260,
    )  # fmt: skip


async def test_the_real_node_sandbox_runs_the_example_package_for_real(tmp_path: Path) -> None:
    mark, before = uuid.uuid4().hex, _rig_dirs()
    proc = await _sandbox(
        "--real-node", "--gpu-nodes", "3", "--cpu-nodes", "1", "--stage-duration", "1s",
        "--timeout", "300", mark=mark,
    )  # fmt: skip
    assert proc.stdout is not None
    text = ""
    try:
        text = await _read_until(proc.stdout, "Press Ctrl-C", 420)
        assert "NodeWright sysctl-tuning is Ready on the real node" in text, text
        assert "NodeWright gpu-node-tuning is Ready" in text, text
        # What the package changed, where the sandbox says to look (the node's host root).
        conf = re.search(r"cat (\S+/etc/sysctl\.d/90-nodewright-sysctl-tuning\.conf)", text)
        swappiness = re.search(r"cat (\S+/proc/sys/vm/swappiness)", text)
        logs = re.search(r"ls -R (\S+/var/log/nodewright/sysctl-tuning)", text)
        assert conf, text
        assert swappiness, text
        assert logs, text
        sysctl, value, files = await asyncio.to_thread(
            _changed, conf.group(1), swappiness.group(1), logs.group(1)
        )
        assert "vm.swappiness = 10" in sysctl, sysctl
        assert value == "10", value
        assert files, "the package's stage logs on the node"
        # A package of one's own, through the registry the sandbox names.
        registry = re.search(r"buildah push --tls-verify=false (\S+)/my-package:1\.0\.0", text)
        kubeconfig = re.search(r"export KUBECONFIG=(\S+)", text)
        kubectl = re.search(r"^\s*(\S+/kubectl) get nodes", text, re.MULTILINE)
        assert registry, text
        assert kubeconfig, text
        assert kubectl, text
        await asyncio.to_thread(
            _own_package, tmp_path, registry.group(1), kubeconfig.group(1), kubectl.group(1)
        )
        motd = Path(conf.group(1).removesuffix("/etc/sysctl.d/90-nodewright-sysctl-tuning.conf"))
        assert (motd / "etc" / "motd").read_text() == "own package\n"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        rest, _ = await asyncio.wait_for(proc.communicate(), 240)
        text += rest.decode(errors="replace")
    assert proc.returncode == 0, text
    await _nothing_left(mark, before)
