"""``nodewright package logs -f`` follows a running pod's log through the API server as the
pod writes it.

The rig's nodes keep no logs (kwok serves none for them), so this test runs a kwok of its
own, as kwok simulates a kubelet's log endpoint: over TLS, on a port the node's status
names, serving a file in the container runtimes' log format as the pod's container log (a
``ClusterLogs`` with ``follow``). The
kube-apiserver proxies ``pods/log?follow=true`` to it as to a kubelet. The test appends to
the file and the command prints each line as it comes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from nodewright.rig import Rig, free_port, pki
from shared import pods, podspec, progress
from shared.kube import Kube, path_of
from tests.cli.conftest import Objects
from tests.helpers.cli import interruptible
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(180)

PACKAGES = {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}}


def _config(namespace: str, log: Path) -> list[dict[str, object]]:
    """A kwok that answers for its nodes' kubelet: their address and port, running pods, and
    the container ``apply``'s log from ``log``."""
    node_status = """
      {{ $now := Now }}
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: kwok
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      addresses:
      - {address: 127.0.0.1, type: InternalIP}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ NodePort }}
      allocatable: {cpu: "8", memory: 32Gi, pods: "110"}
      capacity: {cpu: "8", memory: 32Gi, pods: "110"}
      nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: kwok}
      phase: Running
    """
    pod_status = """
      {{ $now := Now }}
      conditions:
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: false
        restartCount: 0
        state: {running: {startedAt: {{ $now | Quote }}}}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
    """
    not_ready = {
        "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
        "operator": "NotIn",
        "values": ["True"],
    }
    return [
        {
            "kind": "KwokConfiguration",
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "options": {
                "cidr": "10.1.0.0/16",
                "podPlayStageParallelism": 4,
                "nodePlayStageParallelism": 4,
                "enableDebuggingHandlers": True,  # the kubelet API: logs
            },
        },
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": "node-up"},
            "spec": {
                "resourceRef": {"apiGroup": "v1", "kind": "Node"},
                "selector": {"matchExpressions": [not_ready]},
                "next": {"statusTemplate": node_status},
            },
        },
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": "pod-running"},
            "spec": {
                "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
                "selector": {
                    "matchExpressions": [
                        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                        not_ready,
                    ]
                },
                "next": {"statusTemplate": pod_status},
            },
        },
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterLogs",
            "metadata": {"name": "agent-log"},
            "spec": {
                "selector": {"matchNamespaces": [namespace]},
                "logs": [{"containers": ["apply"], "logsFile": str(log), "follow": True}],
            },
        },
    ]


@contextlib.contextmanager
def kubelet_kwok(rig: Rig, directory: Path, namespace: str, log: Path, mark: str) -> Iterator[int]:
    """A kwok serving its nodes' kubelet API over TLS on a free port; stopped by pid."""
    port = free_port()
    certs = pki.write(directory / "pki")
    config = directory / "kwok.yaml"
    config.write_text(yaml.safe_dump_all(_config(namespace, log)))
    with (directory / "kwok.log").open("wb") as out:
        proc = subprocess.Popen(
            [
                str(rig.bin_dir / "kwok"),
                f"--kubeconfig={rig.endpoints.kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node={mark}",
                f"--server-address=127.0.0.1:{port}",
                f"--node-port={port}",
                f"--tls-cert-file={certs.serving_cert}",
                f"--tls-private-key-file={certs.serving_key}",
                "--node-lease-duration-seconds=0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HOME": str(directory)},
        )
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cri(text: str) -> str:
    """One line of a container log file as container runtimes write it (what kwok reads)."""
    return f"{datetime.now(UTC).isoformat().replace('+00:00', 'Z')} stdout F {text}\n"


def _healthy(port: int) -> bool:
    ctx = ssl._create_unverified_context()  # kwok's own throw-away certificate
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=2):
            return True
    except OSError:
        return False


async def test_follow_prints_a_running_pods_log_lines_as_they_are_written(
    rig: Rig, kapi: Kube, objects: Objects, namespace: str, tmp_path: Path
) -> None:
    cr = await objects.nodewright("follow", PACKAGES)
    mark = f"logs-{uuid.uuid4().hex[:6]}"
    node = objects.name("n-logs")
    log = tmp_path / "agent.log"
    log.write_text(cri("first line, before the command started"))
    with kubelet_kwok(rig, tmp_path, namespace, log, mark) as port:
        await eventually(lambda: asyncio.to_thread(_healthy, port), what="the kubelet kwok")
        await kapi.create(
            path_of(plural="nodes"),
            {
                "metadata": {
                    "name": node,
                    "labels": {"pool": cr.metadata.name},
                    "annotations": {"kwok.x-k8s.io/node": mark},
                }
            },
        )
        objects.nodes.append(node)
        d = progress.desired(cr)["tuning"]
        name = pods.pod_name(
            cr=cr.metadata.name,
            node=node,
            role="stage",
            package="tuning",
            stage="apply",
            version=d.version,
            attempt=1,
        )
        req = podspec.PodRequest(
            role="stage",
            package="tuning",
            stage="apply",
            version=d.version,
            attempt=1,
            image=d.image,
            desired=d,
            name=name,
        )
        settings = podspec.PodSettings(namespace=namespace, agent_image="registry.example/agent:1")
        body = podspec.stage_pod(
            req, cr=cr, node=node, node_annotations={}, settings=settings, node_metadata="{}"
        )
        # The stage runs in the init container named after it, its check after it.
        assert body["spec"]["initContainers"][0]["name"] == "apply"
        assert body["spec"]["containers"][0]["name"] == "apply-check"
        await kapi.create(path_of(plural="pods", namespace=namespace), body)

        async def running() -> bool:
            pod = await kapi.get(path_of(plural="pods", namespace=namespace, name=name))
            return (pod.get("status") or {}).get("phase") == "Running"

        await eventually(running, what="the pod running on the kubelet kwok's node")
        with interruptible():  # ^C below must reach it as from a terminal
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "nodewright.cli",
                "package",
                "logs",
                "tuning",
                "--node",
                node,
                "-n",
                namespace,
                "-f",
                "--kubeconfig",
                str(rig.endpoints.kubeconfig),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # SIGABRT then prints where every thread is, should the command not end
                # after ^C.
                env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            )
        stdout, stderr = proc.stdout, proc.stderr
        assert stdout is not None
        assert stderr is not None
        try:

            async def line() -> str:
                got: bytes = await asyncio.wait_for(stdout.readline(), 30)
                if not got:
                    said = (await stderr.read()).decode()
                    pytest.fail(f"the command ended ({await proc.wait()}): {said}")
                return got.decode()

            # The stage runs (this kwok runs the init container): followed; its check, after
            # it in the same pod, has not started and is not shown.
            header = await line()
            assert header.startswith(f"==> pod {name}: NodeWright {cr.metadata.name}"), header
            assert header.rstrip().endswith("stage apply, attempt 1, Running <== (following)"), (
                header
            )
            assert await line() == "first line, before the command started\n"
            for n in range(3):
                with log.open("a") as f:
                    f.write(cri(f"written while following, {n}"))
                assert await line() == f"written while following, {n}\n"
            assert proc.returncode is None, "it keeps following"
            proc.send_signal(signal.SIGINT)
            try:
                code = await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.send_signal(signal.SIGABRT)
                await asyncio.wait_for(proc.wait(), 10)
                dump = (await stderr.read()).decode(errors="replace")
                pytest.fail(f"the command had not ended 30 s after ^C; where it was:\n{dump}")
            err = (await stderr.read()).decode()
            # click ends the ^C line first; then the one line.
            assert (code, err.strip()) == (130, "nodewright: interrupted")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await kapi.delete(
            path_of(plural="pods", namespace=namespace, name=name), {"gracePeriodSeconds": 0}
        )
