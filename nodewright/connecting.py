"""How a command reaches the API server, as kubectl would, and what it says when it cannot.

The kubeconfig is found the way kubectl finds it: ``--kubeconfig PATH`` alone when given;
else every file of the ``KUBECONFIG`` list (``:``-separated), merged with kubectl's rules (the
first file to name a cluster, user or context wins, and the first ``current-context`` set);
else ``~/.kube/config``; else, inside a pod, the pod's service account. ``--context`` picks
a context of the merged files. :func:`run` opens one client (``shared.kube.Kube``) for a
command, runs it, and turns every failure into :class:`CommandError`: one line saying what
went wrong and what to do next, never a traceback.

kubernetes_asyncio and aiohttp are imported only when a command connects: ``--help`` and
commands that never talk to the API server do not pay for them. What a command does with
the client is its own business.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from kubernetes_asyncio import client

    from shared.kube import Kube

T = TypeVar("T")

_IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
_TIMEOUT_S = 30.0
"""Per request: a server that does not answer in this long is reported, not waited for."""
CLOSE_DEADLINE_S = 5.0
"""How long the client's connections get to close when a command ends (its answer is out, or
^C): asyncio waits up to 30 s for a TLS close the server does not answer."""


class CommandError(Exception):
    """A problem to tell the user in one line (exit code 1), not a crash."""


@dataclass(frozen=True)
class Target:
    """Which cluster to talk to, from the standard flags."""

    kubeconfig: str = ""
    """--kubeconfig: this file only."""
    context: str = ""
    """--context: a context of the kubeconfig (default: its current-context)."""


def kubeconfig_files(target: Target, environ: os._Environ[str] | dict[str, str]) -> list[str]:
    """The kubeconfig files to merge, in kubectl's order; [] means in-cluster credentials."""
    if target.kubeconfig:
        path = Path(target.kubeconfig).expanduser()
        if not path.is_file():
            raise CommandError(
                f"--kubeconfig {target.kubeconfig}: no such file (give the path of a kubeconfig)"
            )
        return [str(path)]
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        found = [str(Path(p).expanduser()) for p in listed if Path(p).expanduser().is_file()]
        if not found:
            raise CommandError(
                f"KUBECONFIG={environ['KUBECONFIG']} names no existing file: point it at a "
                "kubeconfig, or pass --kubeconfig PATH"
            )
        return found
    home = Path(environ.get("HOME") or Path.home()) / ".kube" / "config"
    return [str(home)] if home.is_file() else []


def _merged(files: list[str]) -> Any:
    """The merged kubeconfig as kubernetes_asyncio's ConfigNode, with kubectl's
    current-context: the first file that sets one (kubernetes_asyncio takes the last)."""
    import yaml
    from kubernetes_asyncio.config.kube_config import KubeConfigMerger

    merger = KubeConfigMerger(os.pathsep.join(files))
    if merger.config is None:
        raise CommandError(f"the kubeconfig {', '.join(files)} is empty")
    for path in files:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if isinstance(loaded, dict) and loaded.get("current-context"):
            merger.config.value["current-context"] = loaded["current-context"]
            break
    return merger.config


def _context_names(merged: Any) -> list[str]:
    return sorted(str(c["name"]) for c in merged.value.get("contexts") or () if "name" in c)


def sources(target: Target) -> list[str]:
    """The kubeconfig files of ``target``, [] for the pod's service account; CommandError
    when there is neither (checked before any client library is imported)."""
    files = kubeconfig_files(target, os.environ)
    if files:
        return files
    if target.context:
        raise CommandError(
            f"--context {target.context}: there is no kubeconfig to find it in (no "
            "--kubeconfig, KUBECONFIG or ~/.kube/config)"
        )
    if not (os.environ.get("KUBERNETES_SERVICE_HOST") and _IN_CLUSTER_TOKEN.is_file()):
        raise CommandError(
            "no kubeconfig: pass --kubeconfig PATH, set KUBECONFIG, or create "
            "~/.kube/config (in a pod, the pod's service account is used)"
        )
    return []


def configuration(files: list[str], context: str) -> Awaitable[client.Configuration]:
    """The client configuration from the kubeconfig ``files`` (none: in-cluster)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.config import ConfigException, load_incluster_config
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader

    cfg = client.Configuration()
    if not files:
        load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]

        async def ready() -> client.Configuration:
            return cfg

        return ready()
    where = ", ".join(files)
    try:
        merged = _merged(files)
    except (OSError, ValueError) as exc:
        raise CommandError(f"cannot read the kubeconfig {where}: {exc}") from None
    names = _context_names(merged)
    wanted = context or str(merged.value.get("current-context") or "")
    if not wanted:
        raise CommandError(
            f"the kubeconfig {where} sets no current-context: pass --context NAME (it has: "
            f"{', '.join(names) or 'none'})"
        )
    if wanted not in names:
        raise CommandError(
            f"context {wanted} is not in the kubeconfig {where} (it has: "
            f"{', '.join(names) or 'none'}); pick one with --context NAME"
        )

    async def load() -> client.Configuration:
        try:
            loader = KubeConfigLoader(
                config_dict=merged, active_context=wanted, config_base_path=None
            )
            await loader.load_and_set(cfg)
        except ConfigException as exc:
            raise CommandError(
                f"the kubeconfig {where} cannot be used: {exc} (`kubectl config view` shows it)"
            ) from None
        return cfg

    return load()


def _explain_api_error(exc: Any, server: str) -> str:
    status = int(exc.status)
    said = f"the API server at {server} said {status} {exc.reason}: {exc.message}"
    if status == 401:
        return f"{said} (the kubeconfig's credentials were refused: log in again)"
    if status == 403:
        return f"{said} (your user lacks the RBAC permission; `kubectl auth can-i` checks it)"
    if status == 404 and "could not find the requested resource" in exc.message:
        return (
            f"{said} (are NodeWright's CRDs installed? docs/install.md; `kubectl get crd "
            "nodewrights.nodewright.nvidia.com` checks it)"
        )
    return said


def _no_answer(cause: BaseException) -> str:
    """The reason a request got no answer, in words (aiohttp's repr names its internals)."""
    if isinstance(cause, TimeoutError):
        return "no answer in time"
    inner = getattr(cause, "os_error", None) or cause.__cause__ or cause
    text = getattr(inner, "strerror", None) or str(inner)
    return str(text).lower() if text else type(cause).__name__


async def closed(close: Awaitable[object], deadline_s: float) -> None:
    """Await ``close`` for at most ``deadline_s``: the command's answer is already out."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(close, deadline_s)


def run(target: Target, command: Callable[[Kube], Awaitable[T]]) -> T:
    """Run ``command`` with a client for ``target``; every failure becomes CommandError."""
    import aiohttp

    from shared.kube import ApiError

    server = "the cluster"
    files = sources(target)

    async def main() -> T:
        nonlocal server
        from kubernetes_asyncio import client

        from shared.kube import Kube
        from shared.kubeaccess import ApiClientTransport

        cfg = await configuration(files, target.context)
        server = str(cfg.host)
        api = client.ApiClient(configuration=cfg)
        try:
            return await command(Kube(ApiClientTransport(api)))
        finally:
            await closed(api.close(), CLOSE_DEADLINE_S)

    try:
        return asyncio.run(main())
    except ApiError as exc:
        if exc.status == 0 and exc.__cause__ is not None:
            # No answer at all: say why the connection failed, not the request it carried.
            raise CommandError(
                f"cannot reach the API server at {server}: {_no_answer(exc.__cause__)} (is the "
                "cluster up? check --context / --kubeconfig)"
            ) from None
        raise CommandError(_explain_api_error(exc, server)) from None
    except (aiohttp.ClientConnectionError, ConnectionError) as exc:
        raise CommandError(
            f"cannot reach the API server at {server}: {exc} (is the cluster up? check "
            "--context / --kubeconfig)"
        ) from None
    except TimeoutError:
        raise CommandError(
            f"the API server at {server} did not answer in {_TIMEOUT_S:.0f}s (is it "
            "overloaded or unreachable? check --context / --kubeconfig)"
        ) from None
    except aiohttp.ClientError as exc:
        raise CommandError(f"talking to the API server at {server} failed: {exc}") from None


def names(target: Target, plural: str, *, timeout_s: float = 2.0) -> list[str]:
    """The names of ``plural`` (``nodes``, ``nodewrights``) for shell completion; [] when the
    cluster does not answer within ``timeout_s``."""
    from shared import api
    from shared.kube import path_of

    path = (
        path_of(group=api.GROUP, version=api.VERSION, plural=plural)
        if plural != "nodes"
        else path_of(plural="nodes")
    )

    async def command(kube: Kube) -> list[str]:
        async with asyncio.timeout(timeout_s):
            listed = await kube.get(path)
        return sorted(str(o["metadata"]["name"]) for o in listed.get("items") or ())

    try:
        return run(target, command)
    except CommandError:
        return []
