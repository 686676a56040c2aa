"""``nodewright package validate DIR [-o json]``, ``nodewright package rerun NAME --node
NODE [--nodewright CR] [--stage STAGE]``, ``nodewright package status NAME --nodewright CR``
and ``nodewright package logs NAME --node NODE``.

``validate`` checks a package directory before it is built into an image, or the built image
archive before it is published (``nodewright.package_image``: the files must be at the
image's root), with the agent's own rules (``agent.validate``: the same check the agent runs
before every mode), and lists every problem, each naming its file or JSON path. Exit 0 when
the package is valid, 3 when it is not (the agent's exit code for an invalid package).

``rerun`` asks the executor, through a recovery request on the node (see ``nodewright.node_cmd`` and
docs/recovery.md), to run one package's cycle again on one node — or only one stage of it
and the stages after it — and says what will run. A finished node goes back through
admission and its drain first, within the rollout's budget. Deciding is the executor's job.

``status NAME --nodewright CR [--node NODE ...] [-o json]`` prints, per target node (or per
named node), where the package stands as the executor's record on the node says: version,
stage, state and attempt (and, in JSON, the installed version, the reason and the stage
check's verdict).

``logs NAME --node NODE [--nodewright CR] [--stage STAGE] [--tail N] [--raw]`` prints the logs
of the package's stage pods (each stage and its check) on the node through the pods/log API,
the agent's events rendered for a person (``nodewright.agentlog``) unless ``--raw``. The
pods are found by their labels (``shared.pods.labels``: NodeWright, role, package, stage)
and the node they are bound to (``spec.nodeName``), never by guessing names. A log that
cannot be fetched is named with its pod and container, and the command then exits 1.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from agent.errors import ExitCode
from nodewright import agentlog, node_cmd, output, package_image
from nodewright.connecting import CommandError, Target, run
from nodewright.node_cmd import DryRun
from shared import api, nodestate, pods, progress
from shared.kube import ApiError, Kube, path_of
from shared.records.executor import PackageRecord
from shared.records.validator import CheckRecord

STAGES = (*nodestate.RERUN_STAGES, "uninstall")
"""Stages a package's pods run (the interrupt pod is the node's, not a package's)."""


async def rerun(
    client: Kube, name: str, node_name: str, only: str, stage: str, dry_run: DryRun
) -> None:
    node = await node_cmd.get_node(client, node_name)
    crs = [cr for cr in node_cmd.crs_on(node) if name in progress.facts(node, cr).executor.packages]
    if only:
        if only not in crs:
            raise CommandError(
                f"NodeWright {only} has not run package {name} on {node_name} (`nodewright "
                f"node status {node_name}` shows what it ran)"
            )
        crs = [only]
    if not crs:
        raise CommandError(
            f"no NodeWright has run package {name} on node {node_name} (`nodewright node "
            f"status {node_name}` shows what ran there)"
        )
    if len(crs) > 1:
        raise CommandError(
            f"several NodeWrights run package {name} on {node_name} ({', '.join(crs)}):"
            " pick one with --nodewright"
        )
    (cr,) = crs
    rec = progress.facts(node, cr).executor.packages[name]
    req = await node_cmd.add_request(
        client, node_name, cr, "rerun", package=name, stage=stage, dry_run=dry_run
    )
    what = (
        f"stage {stage} (and the stages after it)"
        if stage
        else "its install from apply"
        if rec.state == "succeeded" and rec.installed == rec.version
        else f"its {rec.cycle} cycle from the start"
    )
    verb = "Would request" if dry_run != "none" else "Requested"
    output.say(
        f"{verb} rerun #{req.seq} of package {name} {rec.version} of NodeWright {cr} "
        f"on node {node_name}: {what} runs again as attempt {rec.attempt + 1}; the node is "
        "validated again afterwards."
    )
    note = node_cmd.dry_run_note(dry_run)
    if note:
        output.say(note)


def run_rerun(
    target: Target, name: str, *, node: str, nodewright: str, stage: str, dry_run: DryRun
) -> None:
    async def command(client: Kube) -> None:
        await rerun(client, name, node, nodewright, stage, dry_run)

    run(target, command)


# ---- status -----------------------------------------------------------------------------


def status_row(
    cr: api.NodeWright, package: str, node: Mapping[str, Any], target: bool
) -> dict[str, Any]:
    """Where ``package`` stands on ``node`` in the executor's record: pure."""
    f = progress.facts(node, cr.metadata.name)
    r = f.executor.packages.get(package)
    if r is None:
        wanted = progress.desired(cr).get(package)
        return {
            "node": f.name,
            "package": package,
            "version": wanted.version if wanted is not None else "",
            "stage": "",
            "state": "pending" if target else "not a target",
            "attempt": 0,
            "installed": "",
            "reason": None,
            "check": None,
        }
    check = f.validator.checks.get(nodestate.check_key(package, r.version, r.stage))
    return {
        "node": f.name,
        "package": package,
        "version": r.version,
        "stage": r.stage,
        "state": r.state,
        "attempt": r.attempt,
        "installed": r.installed,
        "reason": msgspec.to_builtins(r.reason) if r.reason is not None else None,
        "check": _check(r, check),
    }


def _check(r: PackageRecord, check: CheckRecord | None) -> str | None:
    """The verdict of the check of ``r``'s current stage and attempt. A verdict about an
    earlier attempt or run no longer counts (``progress.verdict_about``); a stage recorded as
    succeeded without one has its check running. A stage whose check runs in its pod reads
    as running, without a verdict, until the validator records one: neither the stage's end
    nor the check's start is written (its pod says it runs)."""
    if check is not None and progress.verdict_about(r, check):
        return check.verdict
    if r.state == "succeeded" and r.stage in progress.CHECKED_STAGES:
        return "running"
    return None


def status_rows(
    cr: api.NodeWright, package: str, nodes: Sequence[Mapping[str, Any]], only: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One row per target node of ``cr`` (or per node named in ``only``), sorted by name."""
    rows = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        labels = (node.get("metadata") or {}).get("labels") or {}
        target = progress.selector_matches(cr.spec.node_selectors, labels)
        if (node["metadata"]["name"] in only) if only else target:
            rows.append(status_row(cr, package, node, target))
    return rows


STATUS_HEADERS = ("NODE", "PACKAGE", "VERSION", "STAGE", "STATE", "ATTEMPT")
STATUS_WIDE_HEADERS = (*STATUS_HEADERS, "INSTALLED", "CHECK", "REASON")


def render_status(rows: Sequence[Mapping[str, Any]], *, wide: bool = False) -> str:
    """The ``package status`` table: NODE PACKAGE VERSION STAGE STATE ATTEMPT; wide adds the
    installed version, the check's verdict and the stage's reason."""
    cells = []
    for r in rows:
        cell = [
            r["node"],
            r["package"],
            r["version"] or "-",
            r["stage"] or "-",
            r["state"],
            str(r["attempt"]) if r["attempt"] else "-",
        ]
        if wide:
            reason = r["reason"]
            cell += [
                r["installed"] or "-",
                r["check"] or "-",
                f"{reason['code']}: {reason['message']}" if reason else "-",
            ]
        cells.append(cell)
    return output.table(STATUS_WIDE_HEADERS if wide else STATUS_HEADERS, cells)


async def status(
    client: Kube, name: str, nodewright: str, only: Sequence[str], fmt: output.Format
) -> None:
    cr = await node_cmd.require_nodewright(client, nodewright)
    if only:
        nodes = [await node_cmd.get_node(client, n) for n in dict.fromkeys(only)]
    else:
        nodes = (await client.get(path_of(plural="nodes")))["items"]
    recorded = any(name in progress.facts(n, nodewright).executor.packages for n in nodes)
    if name not in cr.spec.packages and not recorded:
        has = ", ".join(sorted(cr.spec.packages)) or "none"
        raise CommandError(f"NodeWright {nodewright} has no package {name} (it has: {has})")
    rows = status_rows(cr, name, nodes, only)
    if fmt in ("json", "yaml"):
        output.say(output.document({"nodewright": nodewright, "nodes": rows}, fmt))
    elif not rows:
        output.say(f"NodeWright {nodewright} selects no node.")
    else:
        output.say(render_status(rows, wide=fmt == "wide"))


def run_status(
    target: Target, name: str, *, nodewright: str, nodes: Sequence[str], fmt: output.Format
) -> None:
    async def command(client: Kube) -> None:
        await status(client, name, nodewright, nodes, fmt)

    run(target, command)


# ---- logs -------------------------------------------------------------------------------


def log_selector(package: str, *, nodewright: str = "") -> str:
    """The label selector of a package's stage pods, and check pods of earlier versions
    (``shared.pods.labels``). Not by stage: a pod's stage label is the first of the stages
    it runs (:func:`log_pods` picks the stage)."""
    parts = [
        f"{pods.LABEL_MANAGED}={pods.MANAGED_BY}",
        f"{pods.LABEL_ROLE} in (stage,check)",
        f"{pods.LABEL_PACKAGE}={package}",
    ]
    if nodewright:
        parts.append(f"{pods.LABEL_CR}={nodewright}")
    return ",".join(parts)


def log_pods(listed: Sequence[Mapping[str, Any]], node: str, stage: str = "") -> list[pods.PodView]:
    """The pods on ``node``, oldest first (attempts in the order they ran): a stage pod as
    its first stage and each later stage and check once it started (``shared.pods.parts``);
    with ``stage``, only that stage and its check."""
    views = [
        part
        for p in listed
        for i, part in enumerate(pods.parts(p))
        if (i == 0 or part.phase != "Pending") and (not stage or part.stage == stage)
    ]
    mine = [v for v in views if v.node == node]
    return sorted(mine, key=lambda v: (v.created or datetime.min.replace(tzinfo=UTC), v.name))


def log_container(pod: pods.PodView, listed: Sequence[Mapping[str, Any]]) -> str:
    """The container whose log is ``pod``'s part (its stage's or its check's), else the
    pod's first container (the agent)."""
    if pod.container:
        return pod.container
    raw = next((p for p in listed if p["metadata"]["name"] == pod.name), {})
    if pods.has_check(raw):
        return pods.CHECK_CONTAINER if pod.role == "check" else pods.STAGE_CONTAINER
    first = ((raw.get("spec") or {}).get("containers") or [{}])[0]
    return str(first.get("name") or pods.STAGE_CONTAINER)


def log_header(pod: pods.PodView) -> str:
    what = f"stage {pod.stage}" if pod.role == "stage" else f"check of stage {pod.stage}"
    return (
        f"==> pod {pod.name}: NodeWright {pod.cr}, package {pod.package} {pod.version}, "
        f"{what}, attempt {pod.attempt}, {pod.phase} <=="
    )


def log_query(container: str, tail: int, *, follow: bool = False) -> dict[str, str | int | bool]:
    query: dict[str, str | int | bool] = {"container": container}
    if tail >= 0:
        query["tailLines"] = tail
    if follow:
        query["follow"] = True
    return query


def _unfetched(pod: str, container: str, namespace: str, exc: ApiError) -> str:
    return (
        f"nodewright: cannot fetch the log of pod {pod} ({container}): the API server said "
        f"{exc.status}: {exc.message} (simulated nodes, such as kwok's, keep no logs; "
        f"`kubectl -n {namespace} describe pod {pod}` shows its state)"
    )


async def _follow(
    client: Kube, path: str, query: Mapping[str, Any], prefix: str, *, raw: bool
) -> None:
    async for line in client.stream_text(path, query):
        shown = line if raw else agentlog.line(line)
        sys.stdout.write(prefix + (shown if shown.endswith("\n") else shown + "\n"))
        sys.stdout.flush()


NEXT_PART_POLL_S = 0.5
"""How often ``logs -f`` looks at a pod for its next container to start."""


async def _next_part(
    client: Kube,
    namespace: str,
    name: str,
    followed: set[str],
    stage: str,
    raw: Mapping[str, Any],
) -> tuple[pods.PodView | None, Mapping[str, Any]]:
    """The first part of pod ``name`` (``shared.pods.parts``; with ``stage``, that stage's
    and its check's) whose container was not followed yet, once it started; None when the
    pod ended (or is gone) with none left to start."""
    while True:
        try:
            raw = await client.get(path_of(plural="pods", namespace=namespace, name=name))
        except ApiError as exc:
            if exc.not_found:
                return None, raw
            raise
        left = [
            p
            for p in pods.parts(raw)
            if (not stage or p.stage == stage) and log_container(p, [raw]) not in followed
        ]
        if not left:
            return None, raw
        if left[0].phase != "Pending":
            return left[0], raw
        if (raw.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return None, raw
        await asyncio.sleep(NEXT_PART_POLL_S)


async def logs(
    client: Kube,
    name: str,
    *,
    node: str,
    nodewright: str,
    stage: str,
    tail: int,
    follow: bool,
    namespace: str,
    raw: bool = False,
) -> None:
    if tail < -1:
        raise CommandError(f"--tail {tail}: give a number of lines, or -1 for all of it")
    await node_cmd.get_node(client, node)
    selector = log_selector(name, nodewright=nodewright)
    listed = await client.get(
        path_of(plural="pods", namespace=namespace),
        labelSelector=selector,
        fieldSelector=f"spec.nodeName={node}",
    )
    found = log_pods(listed["items"], node, stage)
    if not found:
        narrowed = "".join(
            f", {what} {value}"
            for what, value in (("NodeWright", nodewright), ("stage", stage))
            if value
        )
        raise CommandError(
            f"no pod of package {name} on node {node} in namespace "
            f"{namespace}{narrowed}. The executor keeps a stage's pod while it runs and "
            "after it failed, and deletes it once the node has moved on; `nodewright package "
            f"status {name} --nodewright CR --node {node}` shows where the package "
            "stands (pods in another namespace: --namespace)"
        )
    # Followed: the pods that may still write (not finished); the others are printed whole.
    live = [p for p in found if follow and p.phase in ("Pending", "Running")]
    unfetched: list[str] = []
    for pod in found:
        if pod in live:
            continue
        output.say(log_header(pod))
        path = path_of(plural="pods", namespace=namespace, name=pod.name, subresource="log")
        try:
            text = await client.get_text(path, log_query(log_container(pod, listed["items"]), tail))
        except ApiError as exc:
            container = log_container(pod, listed["items"])
            unfetched.append(f"{pod.name} ({container})")
            output.say(_unfetched(pod.name, container, namespace, exc), err=True)
            continue
        shown = text if raw else agentlog.render(text)
        sys.stdout.write(shown if not shown or shown.endswith("\n") else shown + "\n")
        sys.stdout.flush()
    if live:
        for pod in live:
            output.say(log_header(pod) + (" (following)" if len(live) == 1 else ""))

        async def one(pod: pods.PodView) -> None:
            prefix = f"[{pod.name}] " if len(live) > 1 else ""
            path = path_of(plural="pods", namespace=namespace, name=pod.name, subresource="log")
            part: pods.PodView | None = pod
            raw = next(p for p in listed["items"] if p["metadata"]["name"] == pod.name)
            followed: set[str] = set()
            while part is not None:
                container = log_container(part, [raw])
                if followed:
                    output.say(prefix + log_header(part))
                followed.add(container)
                try:
                    query = log_query(container, tail, follow=True)
                    await _follow(client, path, query, prefix, raw=raw)
                except ApiError as exc:
                    unfetched.append(f"{pod.name} ({container})")
                    output.say(_unfetched(pod.name, container, namespace, exc), err=True)
                    return
                # The pod's next container (its stage's check, the next stage) starts once
                # this one exited 0: it is followed too, until the pod has nothing left to run.
                part, raw = await _next_part(client, namespace, pod.name, followed, stage, raw)

        await asyncio.gather(*(one(p) for p in live))
    if unfetched:
        raise CommandError(
            f"the logs of {len(unfetched)} of {len(found)} containers could not be fetched: "
            + ", ".join(unfetched)
        )


def run_logs(
    target: Target,
    name: str,
    *,
    node: str,
    nodewright: str,
    stage: str,
    tail: int,
    follow: bool,
    namespace: str,
    raw: bool = False,
) -> None:
    async def command(client: Kube) -> None:
        await logs(
            client,
            name,
            node=node,
            nodewright=nodewright,
            stage=stage,
            tail=tail,
            follow=follow,
            namespace=namespace,
            raw=raw,
        )

    run(target, command)


def run_validate(package_dir: str, fmt: output.Format) -> int:
    """Check the package directory or built image archive; the agent's exit code (0 valid,
    3 invalid)."""
    problems = package_image.validate(package_dir)
    if fmt in ("json", "yaml"):
        doc = {"package_dir": package_dir, "ok": not problems, "problems": problems}
        output.say(output.document(doc, fmt))
    elif problems:
        output.say(f"{package_dir}: {len(problems)} problems", err=True)
        for problem in problems:
            output.say(f"  {problem}", err=True)
    else:
        output.say(f"{package_dir}: valid")
    return int(ExitCode.OK if not problems else ExitCode.INVALID_PACKAGE)
