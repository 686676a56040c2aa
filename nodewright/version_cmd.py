"""``nodewright version [--client] [-o table|json|yaml]``: which NodeWright is talking to which.

Prints the command line's own version (the installed ``nodewright`` distribution), and,
unless ``--client``, the API server's (``/version``) and the services NodeWright's Helm
chart installed in the namespace (``-n``, default ``nodewright-system``): each Deployment
labelled ``app.kubernetes.io/name=nodewright``, with its ``app.kubernetes.io/version`` label,
image and ready replicas, as the reference's ``kubectl skyhook version`` reports the
operator. No Deployment is not an error: NodeWright may run elsewhere (the sandbox runs its
services as local processes), and the command says so. Read-only.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

from nodewright import output
from nodewright.connecting import Target, run

if TYPE_CHECKING:
    from shared.kube import Kube

DISTRIBUTION = "nodewright"
SERVICES_LABEL = "app.kubernetes.io/name=nodewright"


def client_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


def services(deployments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The services of NodeWright's Deployments, sorted by component: pure."""
    out = []
    for d in deployments:
        meta = d.get("metadata") or {}
        labels = meta.get("labels") or {}
        containers = ((((d.get("spec") or {}).get("template") or {}).get("spec")) or {}).get(
            "containers"
        ) or [{}]
        status = d.get("status") or {}
        wanted = (d.get("spec") or {}).get("replicas", 1)
        out.append(
            {
                "service": labels.get("app.kubernetes.io/component") or meta.get("name"),
                "deployment": meta.get("name"),
                "version": labels.get("app.kubernetes.io/version") or "",
                "image": containers[0].get("image") or "",
                "ready": f"{status.get('readyReplicas') or 0}/{wanted}",
            }
        )
    return sorted(out, key=lambda s: str(s["service"]))


def render(doc: dict[str, Any]) -> str:
    lines = [f"Client version: {doc['client']['version']}"]
    if "server" not in doc:
        return "\n".join(lines)
    lines.append(f"API server version: {doc['server']['gitVersion']}")
    found = doc["services"]
    if not found:
        lines.append(
            f"NodeWright services: none in namespace {doc['namespace']} (no Deployment "
            f"labelled {SERVICES_LABEL}; installed elsewhere? -n NAMESPACE)"
        )
        return "\n".join(lines)
    lines.append(f"NodeWright services in namespace {doc['namespace']}:")
    rows = [[s["service"], s["version"] or "-", s["ready"], s["image"]] for s in found]
    lines.append(output.table(("SERVICE", "VERSION", "READY", "IMAGE"), rows))
    return "\n".join(lines)


def run_version(target: Target, *, client_only: bool, namespace: str, fmt: output.Format) -> None:
    doc: dict[str, Any] = {"client": {"version": client_version()}}
    if not client_only:

        async def command(client: Kube) -> None:
            from shared.kube import path_of

            doc["server"] = await client.get("/version")
            listed = await client.get(
                path_of(group="apps", plural="deployments", namespace=namespace),
                labelSelector=SERVICES_LABEL,
            )
            doc["namespace"] = namespace
            doc["services"] = services(listed.get("items") or [])

        run(target, command)
    output.say(output.document(doc, fmt) if fmt in ("json", "yaml") else render(doc))
