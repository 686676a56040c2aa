"""NodeWright installed on the rig the way a user installs it, with Helm.

The official NATS chart (2.14.2, unmodified) with three JetStream servers and NodeWright's
NATS users (``nodewright nats-users``), then deploy/chart/nodewright with the images
`make images` built and ``nats.streamReplicas=3``: every service runs as a pod on the rig's
real nodes (``nodepool=system``) and reaches the API server and NATS through Services.
Rollouts target kwok nodes (the chart's ``simulatedNodes``: stage pods carry kwok's
annotations). Used by ``nodewright sandbox --helm`` and the install tests (tests/e2e/install).

Not this module's job: starting the rig and its real nodes (:mod:`nodewright.rig`), nor
anything a rollout does; the rig's values below are only what differs from docs/install.md
because this machine has no registry, no storage provisioner and no pullable sidecars.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml

from nodewright import natsusers
from nodewright.rig import Rig, RigError
from nodewright.rig.realnode import NodeSpec

REPO: Final = Path(__file__).resolve().parents[2]
CHART: Final = REPO / "deploy" / "chart" / "nodewright"
NATS_VALUES: Final = REPO / "deploy" / "nats" / "values.yaml"
"""The NATS values docs/install.md recommends (three servers, JetStream)."""
NATS_CHART_VERSION: Final = "2.14.2"
_VENDORED: Final = Path("shared") / "vendor" / "charts" / f"nats-{NATS_CHART_VERSION}.tgz"
NATS_CHART_ENV: Final = "NODEWRIGHT_NATS_CHART"
SYSTEM: Final = {"nodepool": "system"}
NAMESPACE: Final = "nodewright-system"
NATS_NAMESPACE: Final = "nats"
IMAGES: Final = ("pause", "agent", "sysctl-tuning", "coredns", "nats", "nodewright")
"""The images the real nodes import: the services' and the agent's, NATS's, CoreDNS's."""
NATS_PODS: Final = "app.kubernetes.io/name=nats,app.kubernetes.io/instance=nats"
NATS_RIG_VALUES: Final = (
    # What differs on this rig: no registry (the image built here), no storage provisioner,
    # the sidecars' images cannot be pulled, and the servers belong on the real nodes.
    "container.image.repository=nodewright.local/rig/nats",
    "container.image.tag=2.15.1",
    "container.image.pullPolicy=IfNotPresent",
    "config.jetstream.fileStore.pvc.enabled=false",
    "reloader.enabled=false",
    "natsBox.enabled=false",
    "promExporter.enabled=false",
    "podTemplate.merge.spec.nodeSelector.nodepool=system",
)
NODEWRIGHT_RIG_VALUES: Final = (
    "nats.streamReplicas=3",
    "simulatedNodes=true",
    "nodeSelector.nodepool=system",
)
USERS_SECRET: Final = "nodewright-nats-users"
ADMIN: Final = "rig-admin"
"""The rig's own NATS user (all permissions): tests delete the stream with it."""


def system_nodes(count: int = 2) -> tuple[NodeSpec, ...]:
    """The real nodes the cluster's own pods run on (CoreDNS, NATS, NodeWright)."""
    return tuple(NodeSpec(labels=dict(SYSTEM)) for _ in range(count))


def find_nats_chart(explicit: Path | None = None) -> Path:
    """The official NATS chart: ``explicit``, else $NODEWRIGHT_NATS_CHART, else the copy in
    ../shared/vendor beside the clone (or beside a worktree's folder)."""
    given = explicit or (
        Path(os.environ[NATS_CHART_ENV]) if os.environ.get(NATS_CHART_ENV) else None
    )
    candidates = [given] if given else [p / _VENDORED for p in (REPO.parent, REPO.parent.parent)]
    for path in candidates:
        if path.is_file():
            return path
    where = str(given) if given else " or ".join(str(c) for c in candidates)
    raise RigError(
        "nats-chart",
        f"the official NATS chart {NATS_CHART_VERSION} is not at {where}; fetch it with "
        f"`helm pull nats --repo https://nats-io.github.io/k8s/helm/charts/ --version "
        f"{NATS_CHART_VERSION}` and pass --nats-chart PATH (or set {NATS_CHART_ENV})",
    )


def sets(values: tuple[str, ...] | list[str]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def run_tool(rig: Rig, name: str, *args: str, stdin: str = "") -> str:
    """Run the rig's ``helm`` or ``kubectl`` as a user would (KUBECONFIG = the rig's)."""
    done = subprocess.run(
        [str(rig.bin_dir / name), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "KUBECONFIG": str(rig.endpoints.kubeconfig)},
    )
    if done.returncode != 0:
        raise RigError(name, f"`{name} {' '.join(args[:4])}` failed", done.stdout + done.stderr)
    return done.stdout


@dataclass
class NatsInstall:
    """The installed NATS cluster: its servers' pod addresses (the rig routes the pod
    networks to the machine), the rig's admin password, and the Secrets of NodeWright's
    users as `nodewright nats-users` wrote them (name -> data)."""

    admin_password: str
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[str, str] = field(default_factory=dict)

    @property
    def urls(self) -> list[str]:
        return [f"nats://{ip}:4222" for ip in self.pods.values()]


def nats_pods(rig: Rig) -> dict[str, str]:
    """The NATS servers' pods by name, with their pod IP (those that have one)."""
    listed = json.loads(
        run_tool(rig, "kubectl", "get", "pods", "-n", NATS_NAMESPACE, "-o", "json", "-l", NATS_PODS)
    )
    return {
        p["metadata"]["name"]: p["status"]["podIP"]
        for p in listed["items"]
        if (p.get("status") or {}).get("podIP")
    }


def install_nats(rig: Rig, chart: Path, out_dir: Path) -> NatsInstall:
    """The official NATS chart with three JetStream servers and NodeWright's users (their
    Secrets applied in NodeWright's namespace first), as docs/install.md says; waits until
    every server is ready."""
    values, secrets_file = natsusers.write(out_dir, secret=USERS_SECRET, namespace=NAMESPACE)
    admin_password = secrets.token_urlsafe(16)
    doc = yaml.safe_load(values.read_text())
    doc["config"]["merge"]["authorization"]["users"].append(
        {"user": ADMIN, "password": natsusers.hash_password(admin_password)}
    )
    values.write_text(yaml.safe_dump(doc))
    run_tool(rig, "kubectl", "create", "namespace", NAMESPACE)
    run_tool(rig, "kubectl", "apply", "-f", str(secrets_file))
    run_tool(
        rig, "helm", "install", "nats", str(chart), "-n", NATS_NAMESPACE, "--create-namespace",
        "-f", str(NATS_VALUES), "-f", str(values), *sets(NATS_RIG_VALUES),
        "--wait", "--timeout", "300s",
    )  # fmt: skip
    installed = NatsInstall(
        admin_password=admin_password,
        secrets={
            d["metadata"]["name"]: d["stringData"]
            for d in yaml.safe_load_all(secrets_file.read_text())
            if d
        },
        pods=nats_pods(rig),
    )
    if len(installed.pods) != 3:
        raise RigError("nats", f"expected 3 NATS servers with an address, found {installed.pods}")
    return installed


def install_args(*extra: str, name: str = "nodewright") -> list[str]:
    """``helm install`` of NodeWright as docs/install.md says, plus the rig's values."""
    return [
        "install", name, str(CHART), "-n", NAMESPACE, "--create-namespace",
        "--set", "nats.url=nats://nats.nats.svc:4222",
        "--set", f"nats.auth.secretName={USERS_SECRET}", *sets(NODEWRIGHT_RIG_VALUES), *extra,
        "--wait", "--timeout", "300s",
    ]  # fmt: skip


def install_nodewright(rig: Rig, *extra: str, name: str = "nodewright") -> str:
    return run_tool(rig, "helm", *install_args(*extra, name=name))
