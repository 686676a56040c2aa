"""The CLI's recovery and batch commands for real (not ``--dry-run``), against the five
services on kwok nodes: ``package rerun`` runs a finished package's cycle again on one node
only, ``node ignore``/``unignore`` label and unlabel it, and ``reset-batches`` starts the
batches over (the scheduler takes the reset into its batch book)."""

from __future__ import annotations

import asyncio

import pytest

from nodewright import manifests
from nodewright.rig import nodes
from shared import nodestate
from shared.kube import Kube
from shared.rollout.book import BATCHES_ANNOTATION, RESET_ANNOTATION, read_batch_book
from tests.e2e.conftest import NODES, Services, read_cr
from tests.e2e.test_lifecycle import GPU, _cr, _wait_done
from tests.helpers.cli import cli
from tests.helpers.podlog import pod_log
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(400)


async def test_rerun_ignore_unignore_and_reset_batches_act_for_real(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    rig = services.fleet.rig
    await nodes.create_nodes(kapi, names, labels=GPU)
    await nodes.wait_ready(kapi, names)
    await asyncio.to_thread(services.fleet.start_all)
    ns = ("-n", services.namespace)
    tuning = {"version": "1.0.0", "image": "registry.example/tuning"}
    async with pod_log(kapi, services.namespace) as log:
        await manifests.apply(kapi, _cr("again", {"tuning": tuning}, 2))
        await _wait_done(kapi, "again", "the install to finish")

        # package rerun: the cycle runs again on gpu-00 only, and the node is done again.
        mark = len(log.events)
        done = await cli(rig, "package", "rerun", "tuning", "--node", "gpu-00", *ns)
        assert done.code == 0, done.err

        async def rerun_started() -> bool:
            return bool(log.created(mark, node="gpu-00", role="stage", stage="apply"))

        await eventually(rerun_started, timeout_s=120, what="the rerun's apply pod on gpu-00")
        await _wait_done(kapi, "again", "the rerun to finish")
        assert not log.created(mark, node="gpu-01"), "the other node is left alone"

        # node ignore / unignore: the label the scheduler reads, set and removed.
        for verb, expected in (("ignore", "true"), ("unignore", None)):
            done = await cli(rig, "node", verb, "gpu-01", *ns)
            assert done.code == 0, done.err
            labels = (await kapi.get(f"{NODES}/gpu-01"))["metadata"].get("labels") or {}
            assert labels.get(nodestate.IGNORE_LABEL) == expected, verb

        # reset-batches: the annotation, then the scheduler's book takes it in.
        done = await cli(rig, "reset-batches", "again", *ns)
        assert done.code == 0, done.err
        cr = await read_cr(kapi, "again")
        token = cr.metadata.annotations[RESET_ANNOTATION]

        async def reset_taken() -> bool:
            obj = await read_cr(kapi, "again")
            book = read_batch_book(obj.metadata.annotations)
            return BATCHES_ANNOTATION in obj.metadata.annotations and book.reset_token == token

        await eventually(reset_taken, timeout_s=60, what="the scheduler to take the reset in")
