"""An informer whose resourceVersion the API server can no longer serve (410 Gone) lists
again and hands on, as changes, everything that happened while it could not watch.

The case, as it comes in a cluster: a service loses the API server (a partition, its node's
network) while objects change, and the API server restarts meanwhile (an upgrade), so its
watch cache starts after the service's last resourceVersion. On its way back the service's
watch is refused with 410; only a new LIST can say what changed, and the informer must turn
the difference into the adds, updates and deletes its handlers would have seen.

A control plane of its own (started here): the test restarts its API server. The informer
reaches it through a fault proxy (nodewright.rig.faults) that the test cuts; the test's own
writes go direct."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodewright.rig import Rig
from nodewright.rig.faults import FaultProxy
from shared.config import KubeSettings
from shared.informer import Informer, InformerHub, OnChange, running
from shared.kube import JSON, connect, path_of
from tests.helpers.waiting import eventually

pytestmark = [pytest.mark.rig, pytest.mark.timeout(300)]

NS = "relist"


@pytest.fixture(scope="module")
def own_rig() -> Iterator[Rig]:
    """A control plane for this module alone: its API server is restarted."""
    with Rig() as the_rig:
        yield the_rig


def _name(obj: JSON | None) -> str | None:
    return None if obj is None else str(obj["metadata"]["name"])


def _data(obj: JSON | None) -> object:
    return None if obj is None else obj.get("data")


async def test_a_watch_refused_with_410_lists_again_and_hands_on_every_change_missed(
    own_rig: Rig, tmp_path: Path
) -> None:
    proxy = FaultProxy(own_rig).start()
    try:
        link = proxy.api_link()
        through = proxy.kubeconfig_through(link, tmp_path / "kubeconfig-through-proxy")
        async with (
            connect(KubeSettings(kubeconfig=str(own_rig.endpoints.kubeconfig))) as direct,
            connect(KubeSettings(kubeconfig=str(through))) as cut_off,
        ):
            await direct.create_if_absent(path_of(plural="namespaces"), {"metadata": {"name": NS}})
            collection = path_of(plural="configmaps", namespace=NS)
            for name in ("stays", "changes", "goes"):
                await direct.create(collection, {"metadata": {"name": name}, "data": {"v": "1"}})

            # A leader and its follower (services sharing a process): both must see the diff.
            hub = InformerHub()
            seen: dict[str, list[tuple[str | None, str | None, object]]] = {"a": [], "b": []}

            def recorder(who: str) -> OnChange:
                return lambda old, new: seen[who].append((_name(old), _name(new), _data(new)))

            leader = Informer(kube=cut_off, path=collection, on_change=recorder("a"))
            follower = Informer(kube=cut_off, path=collection, on_change=recorder("b"))
            hub.attach(leader)
            hub.attach(follower)
            async with running(leader, follower):
                assert leader.lists == 1
                assert sorted(leader.store) == [f"{NS}/changes", f"{NS}/goes", f"{NS}/stays"]
                for who in seen:
                    seen[who].clear()

                await asyncio.to_thread(proxy.cut, link.name)
                await direct.patch(
                    path_of(plural="configmaps", namespace=NS, name="changes"), {"data": {"v": "2"}}
                )
                await direct.delete(path_of(plural="configmaps", namespace=NS, name="goes"))
                await direct.create(collection, {"metadata": {"name": "new"}, "data": {"v": "1"}})
                # Its watch cache now starts after the informer's last resourceVersion.
                await asyncio.to_thread(own_rig.restart_apiserver)
                assert seen == {"a": [], "b": []}, "nothing reached the informer while cut off"
                await asyncio.to_thread(proxy.restore, link.name)

                async def listed_again() -> bool:
                    return leader.lists == 2 and len(seen["b"]) >= 3

                await eventually(listed_again, what="the informer to list again after a 410")
                await asyncio.sleep(1)  # nothing more comes: the list was the whole difference
                for who in ("a", "b"):
                    assert sorted(seen[who], key=str) == sorted(
                        [
                            ("changes", "changes", {"v": "2"}),
                            ("goes", None, None),
                            (None, "new", {"v": "1"}),
                        ],
                        key=str,
                    ), who
                assert sorted(leader.store) == [f"{NS}/changes", f"{NS}/new", f"{NS}/stays"]
                assert sorted(follower.store) == sorted(leader.store)
                assert leader.lists == 2, "one LIST for the 410, none on the watch's way back"

                # And it watches again from the new list: a later change arrives as an event.
                await direct.patch(
                    path_of(plural="configmaps", namespace=NS, name="stays"), {"data": {"v": "3"}}
                )

                async def watched() -> bool:
                    return ("stays", "stays", {"v": "3"}) in seen["a"]

                await eventually(watched, what="a change after the re-list to arrive by watch")
                assert leader.lists == 2
    finally:
        proxy.stop()
