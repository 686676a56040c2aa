"""The node's metadata reaches package steps: the agent copies the mounted ``node.json`` (as
the services put it in a pod, in the layout the kubelet gives a downward API volume) next to
the staged package on the host and names it in ``NODEWRIGHT_NODE_METADATA_DIR``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared import nodemetadata
from tests.agent.harness import Node, sh, write_package
from tests.helpers.facts import node as node_object, nodewright

pytestmark = pytest.mark.timeout(120, func_only=True)


def mounted_volume(directory: Path, data: dict[str, str]) -> Path:
    """``data`` laid out like a downward API (or ConfigMap) volume: the files are symlinks
    through ``..data`` into a timestamped directory (neither of which may be staged)."""
    stamp = directory / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for key, text in data.items():
        (stamp / key).write_text(text)
    (directory / "..data").symlink_to(stamp.name)
    for key in data:
        (directory / key).symlink_to(f"..data/{key}")
    return directory


def pod_data(gpu: str) -> dict[str, str]:
    """What a pod on a node labelled with ``gpu`` as its GPU model mounts."""
    obj = node_object("gpu-7.example.internal", labels={"nvidia.com/gpu.product": gpu})
    return {nodemetadata.FILE: nodemetadata.text(nodewright(), obj)}


def branching_package(node: Node, directory: Path) -> Path:
    """A package whose step and check branch on the node's GPU model label (plain sh and
    grep: no JSON tool is needed on the host)."""
    scratch = node.scratch()
    script = sh(
        f"""
meta="$NODEWRIGHT_NODE_METADATA_DIR/node.json"
if grep -q '"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"' "$meta"; then
  model=a100
else
  model=other
fi
echo "$NODEWRIGHT_MODE dir=$NODEWRIGHT_NODE_METADATA_DIR model=$model" >> {scratch}/seen
ls -a "$NODEWRIGHT_NODE_METADATA_DIR" | tr '\\n' ' ' >> {scratch}/seen; echo >> {scratch}/seen
"""
    )
    return write_package(
        directory,
        stages={
            "apply": {
                "steps": [{"name": "tune", "path": "tune.sh", "run": "always"}],
                "check": [{"name": "verify", "path": "tune.sh"}],
            }
        },
        scripts={"tune.sh": script},
    )


def test_steps_and_checks_read_the_node_metadata_staged_on_the_host(
    node: Node, tmp_path: Path
) -> None:
    data = pod_data("NVIDIA-A100-SXM4-80GB")
    mounted = mounted_volume(tmp_path / "meta", data)
    pkg = branching_package(node, tmp_path / "pkg")
    env = {"NODEWRIGHT_NODE_METADATA_DIR": str(mounted)}

    applied = node.run("apply", pkg, env=env)
    checked = node.run("apply-check", pkg, env=env)

    assert (applied.returncode, checked.returncode) == (0, 0), applied.events + checked.events
    staged = f"/var/lib/nodewright/{node.cr}/packages/demo/1.0.0/node-metadata"
    seen = node.host(f"/var/tmp/{node.cr}/seen").read_text().splitlines()
    assert seen == [
        f"apply dir={staged} model=a100",
        ". .. node.json ",
        f"apply-check dir={staged} model=a100",
        ". .. node.json ",
    ]
    on_host = node.host(f"{staged}/{nodemetadata.FILE}")
    assert on_host.read_text() == data[nodemetadata.FILE]
    assert not on_host.is_symlink()
    assert json.loads(on_host.read_text())["labels"]["nvidia.com/gpu.product"] == (
        "NVIDIA-A100-SXM4-80GB"
    )


def test_each_run_stages_the_metadata_as_mounted_now(node: Node, tmp_path: Path) -> None:
    pkg = branching_package(node, tmp_path / "pkg")
    first = mounted_volume(tmp_path / "a100", pod_data("NVIDIA-A100-SXM4-80GB"))
    second = mounted_volume(tmp_path / "h100", pod_data("NVIDIA-H100-80GB-HBM3"))

    node.run("apply", pkg, "--node-metadata-dir", str(first))
    node.run("apply", pkg, "--node-metadata-dir", str(second))

    seen = node.host(f"/var/tmp/{node.cr}/seen").read_text().splitlines()
    assert [line.rsplit(" ", 1)[-1] for line in seen[::2]] == ["model=a100", "model=other"]


def test_without_a_mounted_config_map_the_directory_is_there_and_empty(
    node: Node, tmp_path: Path
) -> None:
    pkg = branching_package(node, tmp_path / "pkg")

    result = node.run("apply", pkg)  # the harness points the setting at a missing directory

    assert result.returncode == 0, result.events
    seen = node.host(f"/var/tmp/{node.cr}/seen").read_text().splitlines()
    assert seen[0].endswith("/packages/demo/1.0.0/node-metadata model=other")
    assert seen[1] == ". .. "
