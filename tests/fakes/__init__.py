"""In-memory fakes of NodeWright's own ports (``shared.nodeshell``), for shell tests that run
in milliseconds. Only ports we own are faked; the Kubernetes API and NATS never are.

Known gaps, like controller-runtime's fake client: resourceVersions are a counter of this
fake (every write takes the next one, as etcd revisions do); merge patches apply
``metadata.annotations`` (None removes one) and ``spec`` keys shallowly, which is all the
shell sends; a pod delete checks the UID and resourceVersion preconditions against the
stored object's ``metadata`` (a stored pod without them matches any); nothing is validated;
there are no watches (``get`` is the store).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared import events, nodepins
from shared.decisions import PodRef
from shared.nodeshell import STOP_DEADLINE_S

JSON = dict[str, Any]


@dataclass
class FakeNodes:
    """:class:`shared.nodeshell.NodePort` over a dict of node objects."""

    nodes: dict[str, JSON] = field(default_factory=dict)
    revision: int = 100
    patches: list[tuple[str, JSON]] = field(default_factory=list)
    """Every patch that landed, in order."""
    refused: list[tuple[str, JSON]] = field(default_factory=list)
    """Every patch refused for a stale resourceVersion (409), pins that no longer hold (422)
    or a gone node (404)."""
    confirms: list[tuple[str, bool]] = field(default_factory=list)
    """Every read of a node (a fence without a write), and its answer."""

    def add(self, node: JSON) -> None:
        self.revision += 1
        node = copy.deepcopy(node)
        node["metadata"]["resourceVersion"] = str(self.revision)
        self.nodes[node["metadata"]["name"]] = node

    def touch(self, name: str) -> None:
        """Someone else wrote the node: its resourceVersion moves on."""
        self.revision += 1
        self.nodes[name]["metadata"]["resourceVersion"] = str(self.revision)

    def set_status(self, name: str, status: JSON) -> None:
        """Someone else wrote the node's status: its resourceVersion moves on."""
        self.nodes[name]["status"] = copy.deepcopy(status)
        self.touch(name)

    def get(self, name: str) -> JSON | None:
        node = self.nodes.get(name)
        return copy.deepcopy(node) if node is not None else None

    async def patch(self, name: str, body: JSON, pins: nodepins.Pins | None = None) -> bool:
        node = self.nodes.get(name)
        meta = body.get("metadata") or {}
        wanted = meta.get("resourceVersion")
        if pins is not None:
            stale = not pins.holds(node)
        else:
            stale = (
                node is not None and bool(wanted) and wanted != node["metadata"]["resourceVersion"]
            )
        if node is None or stale:
            self.refused.append((name, body))
            return False
        annotations = node["metadata"].setdefault("annotations", {})
        for key, value in (meta.get("annotations") or {}).items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        node.setdefault("spec", {}).update(body.get("spec") or {})
        self.revision += 1
        node["metadata"]["resourceVersion"] = str(self.revision)
        self.patches.append((name, body))
        return True

    async def confirm(self, name: str, version: str, pins: nodepins.Pins | None = None) -> bool:
        node = self.nodes.get(name)
        if pins is not None:
            current = pins.holds(node)
        else:
            current = node is not None and node["metadata"]["resourceVersion"] == version
        self.confirms.append((name, current))
        return current


@dataclass
class FakeObjects:
    """:class:`shared.nodeshell.ObjectPort`: pods and ConfigMaps by name."""

    objects: dict[tuple[str, str], JSON] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    async def create(self, body: JSON) -> bool:
        key = (str(body.get("kind")), str(body["metadata"]["name"]))
        if key in self.objects:
            return False  # AlreadyExists
        self.objects[key] = copy.deepcopy(body)
        self.created.append(f"{key[0]}/{key[1]}")
        return True

    conflicts: list[str] = field(default_factory=list)
    """Deletes refused because the pod was another object or had changed (409)."""

    async def delete_pod(self, pod: PodRef) -> bool:
        current = self.objects.get(("Pod", pod.name))
        if current is None:
            return True
        meta = current["metadata"]
        if (pod.uid and pod.uid != meta.get("uid", pod.uid)) or (
            pod.resource_version
            and pod.resource_version != meta.get("resourceVersion", pod.resource_version)
        ):
            self.conflicts.append(pod.name)
            return False
        del self.objects[("Pod", pod.name)]
        self.deleted.append(pod.name)
        return True

    stopped: list[str] = field(default_factory=list)

    async def stop_pod(self, pod: PodRef) -> bool:
        current = self.objects.get(("Pod", pod.name))
        if current is None:
            return True
        if pod.uid and pod.uid != current["metadata"].get("uid", pod.uid):
            self.conflicts.append(pod.name)
            return False
        current.setdefault("spec", {})["activeDeadlineSeconds"] = STOP_DEADLINE_S
        self.stopped.append(pod.name)
        return True


@dataclass
class FakeBus:
    """:class:`shared.nodeshell.EventPort`: what was published, deduplicated by id like
    JetStream's ``Nats-Msg-Id``."""

    published: list[events.Event] = field(default_factory=list)

    async def publish(self, event: events.Event) -> bool:
        if any(e.id == event.id for e in self.published):
            return False
        self.published.append(event)
        return True

    def delivered(self, event: events.Event) -> bool:
        return any(e.id == event.id for e in self.published)

    async def settle(self, todo: Sequence[events.Event]) -> None:
        for event in todo:
            await self.publish(event)
