"""``nodewright uninstall-all [--wait] [--timeout SECONDS]``: delete every NodeWright, then
every DeploymentPolicy — what to run before NodeWright itself goes (``helm uninstall``; the
chart's optional pre-delete hook runs this command, docs/install.md "Uninstalling").

Each NodeWright is deleted normally: its finalizer (``nodewright.nvidia.com/uninstall``,
owned by the scheduler) uninstalls its uninstall-enabled packages from the nodes and then
lets it go (docs/packages.md "Deleting a NodeWright"), which needs the services running.
With ``--wait`` the command waits until every NodeWright is gone, printing which remain and
why (their ``DeletionBlocked``, ``UninstallFailed`` and ``UninstallInProgress`` conditions,
written by the status service), then deletes the DeploymentPolicies — only then: the
admission webhook refuses to delete a policy a NodeWright still names. On timeout it exits 1
naming what is left and the ways out; it never removes a finalizer itself (that abandons the
uninstall). It is idempotent: nothing to delete is success, and running it again picks up
where it stopped.

Deciding what a deletion does on the nodes is the services' job; this module only deletes
objects and reads what the services report.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from nodewright import manifests, node_cmd, output
from nodewright.connecting import Target, run
from nodewright.node_cmd import DryRun
from shared import api
from shared.kube import ApiError, Kube

FINALIZER: Final = f"{api.GROUP}/uninstall"
"""The scheduler's finalizer (services/scheduler/core.py ``FINALIZER``)."""
WHY: Final = (
    api.ConditionType.DELETION_BLOCKED,
    api.ConditionType.UNINSTALL_FAILED,
    api.ConditionType.UNINSTALL_IN_PROGRESS,
)
"""The conditions that say why a NodeWright being deleted is still there, most urgent first."""
DEFAULT_TIMEOUT_S: Final = 600.0
POLL_INTERVAL_S: Final = 2.0
REPEAT_AFTER_S: Final = 30.0
"""An unchanged progress report is printed again after this long, so a log shows it lives."""
ABANDON: Final = (
    'kubectl patch nodewright NAME --type=merge -p \'{"metadata":{"finalizers":null}}\''
)


# ---- what a remaining NodeWright waits for (pure) -----------------------------------------


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def reasons(obj: Mapping[str, Any]) -> list[str]:
    """Why a NodeWright being deleted is still there: its true conditions of :data:`WHY`,
    else its finalizers. Read from the raw object, so one that does not decode is reported."""
    meta = obj.get("metadata") or {}
    conditions = {
        c.get("type"): c
        for c in (obj.get("status") or {}).get("conditions") or ()
        if isinstance(c, Mapping) and c.get("status") == "True"
    }
    out = []
    for kind in WHY:
        c = conditions.get(kind)
        if c is not None:
            message = str(c.get("message") or "")
            out.append(f"{kind} ({c.get('reason', '')})" + (f": {message}" if message else ""))
    finalizers = [str(f) for f in meta.get("finalizers") or ()]
    others = [f for f in finalizers if f != FINALIZER]
    if not out and FINALIZER in finalizers:
        out.append(
            f"its finalizer {FINALIZER} is still there and no condition says why yet (the "
            "scheduler uninstalls its packages and removes it; are the services running?)"
        )
    if others:
        out.append(
            f"finalizers not NodeWright's: {', '.join(others)} (whoever added them removes them)"
        )
    if not meta.get("deletionTimestamp"):
        out.insert(0, "not being deleted yet")
    return out or ["being deleted"]


def short(obj: Mapping[str, Any]) -> str:
    """One NodeWright and the names of what holds it, for the one-line timeout error."""
    held = [r.split(":", 1)[0] for r in reasons(obj)]
    return f"{_name(obj)} ({'; '.join(held)})"


def report(remaining: Sequence[Mapping[str, Any]], elapsed_s: float, timeout_s: float) -> list[str]:
    """The progress lines for the NodeWrights still there."""
    lines = [
        f"Waiting for {_plural(len(remaining), 'NodeWright')} to be deleted "
        f"({elapsed_s:.0f}s of {timeout_s:g}s):"
    ]
    lines += [f"  {_name(o)}: {'; '.join(reasons(o))}" for o in remaining]
    return lines


def timeout_message(remaining: Sequence[Mapping[str, Any]], timeout_s: float) -> str:
    return (
        f"timed out after {timeout_s:g}s with {_plural(len(remaining), 'NodeWright')} left: "
        f"{', '.join(short(o) for o in remaining)}; the DeploymentPolicies were not deleted. "
        'Do what each condition says (docs/packages.md "Deleting a NodeWright"; `nodewright '
        "node list --nodewright NAME` shows its nodes) and run `nodewright uninstall-all "
        "--wait` again, or abandon a NodeWright's uninstall (its packages stay on the nodes) "
        f"by removing its finalizer: {ABANDON}"
    )


# ---- the command ------------------------------------------------------------------------


async def _list(client: Kube, path: str) -> list[dict[str, Any]]:
    try:
        listed = await client.get(path)
    except ApiError as exc:
        if exc.not_found:  # the CRD is gone: nothing of that kind is left
            return []
        raise
    return sorted(listed.get("items") or [], key=_name)


async def delete_nodewrights(
    client: Kube, say: Callable[[str], None], *, first: bool = True
) -> list[dict[str, Any]]:
    """Delete every NodeWright not being deleted yet (later calls: those created meanwhile);
    the NodeWrights still there after."""
    for obj in await _list(client, manifests.NODEWRIGHTS):
        name = _name(obj)
        if obj["metadata"].get("deletionTimestamp"):
            if first:
                say(f"NodeWright {name} is being deleted already.")
        elif await client.delete_if_present(f"{manifests.NODEWRIGHTS}/{name}"):
            say(
                f"Deleted NodeWright {name}: its finalizer uninstalls its uninstall-enabled "
                "packages from its nodes, then it goes."
            )
    return await _list(client, manifests.NODEWRIGHTS)


async def wait_gone(
    client: Kube,
    remaining: list[dict[str, Any]],
    *,
    timeout_s: float,
    say: Callable[[str], None],
    interval_s: float = POLL_INTERVAL_S,
) -> None:
    """Poll until no NodeWright is left, reporting what each waits for whenever that
    changes; raise a CommandError naming what is left after ``timeout_s``."""
    t0 = time.monotonic()
    shown: list[str] = []
    shown_at = t0
    while remaining:
        now = time.monotonic()
        lines = report(remaining, now - t0, timeout_s)
        if lines[1:] != shown[1:] or now - shown_at >= REPEAT_AFTER_S:
            for line in lines:
                say(line)
            shown, shown_at = lines, now
        if now - t0 >= timeout_s:
            raise node_cmd.CommandError(timeout_message(remaining, timeout_s))
        await asyncio.sleep(min(interval_s, max(0.0, t0 + timeout_s - now)))
        remaining = await delete_nodewrights(client, say, first=False)
    if shown:
        say(f"Every NodeWright is gone ({time.monotonic() - t0:.0f}s).")


async def delete_policies(client: Kube, say: Callable[[str], None]) -> None:
    for obj in await _list(client, manifests.POLICIES):
        name = _name(obj)
        try:
            deleted = await client.delete_if_present(f"{manifests.POLICIES}/{name}")
        except ApiError as exc:
            raise node_cmd.CommandError(
                f"DeploymentPolicy {name} was not deleted, the API server said {exc.status}: "
                f"{exc.message} (a NodeWright created meanwhile? run the command again)"
            ) from None
        if deleted:
            say(f"Deleted DeploymentPolicy {name}.")


async def dry_run_all(client: Kube, say: Callable[[str], None], dry_run: DryRun) -> None:
    """What ``uninstall-all`` would delete, without deleting (server: the API server checks
    each deletion, and deletes nothing)."""
    for path, kind in (
        (manifests.NODEWRIGHTS, "NodeWright"),
        (manifests.POLICIES, "DeploymentPolicy"),
    ):
        for obj in await _list(client, path):
            name = _name(obj)
            if kind == "NodeWright" and obj["metadata"].get("deletionTimestamp"):
                say(f"NodeWright {name} is being deleted already.")
                continue
            if dry_run == "server":
                try:
                    await client.delete_if_present(f"{path}/{name}", dry_run=True)
                except ApiError as exc:
                    # A policy still named by a NodeWright: the webhook refuses it until the
                    # NodeWrights are gone, which a dry run never makes them.
                    say(
                        f"Would delete {kind} {name} once the NodeWrights are gone; now the "
                        f"API server refuses it ({exc.status}: {exc.message})."
                    )
                    continue
            say(f"Would delete {kind} {name}.")
    say(node_cmd.dry_run_note(dry_run) or "")


async def uninstall_all(
    client: Kube,
    *,
    wait: bool,
    timeout_s: float,
    say: Callable[[str], None],
    dry_run: DryRun = "none",
) -> None:
    if dry_run != "none":
        await dry_run_all(client, say, dry_run)
        return
    remaining = await delete_nodewrights(client, say)
    if wait:
        await wait_gone(client, remaining, timeout_s=timeout_s, say=say)
    elif remaining:
        for line in report(remaining, 0, timeout_s)[1:]:
            say(line)
        say(
            f"{_plural(len(remaining), 'NodeWright')} still being deleted, so the "
            "DeploymentPolicies are left (the webhook refuses deleting a policy still named): "
            "run `nodewright uninstall-all --wait` to wait for them and finish."
        )
        return
    await delete_policies(client, say)
    say("Nothing of NodeWright's is left: no NodeWright, no DeploymentPolicy.")


def run_uninstall_all(target: Target, *, wait: bool, timeout_s: float, dry_run: DryRun) -> None:
    async def command(client: Kube) -> None:
        await uninstall_all(client, wait=wait, timeout_s=timeout_s, say=output.say, dry_run=dry_run)

    run(target, command)
