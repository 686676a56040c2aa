"""Rendering the Helm chart with the rig's helm binary, and running the rig's command-line tools."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nodewright.rig import default_bin_dir

CHART = Path(__file__).resolve().parents[2] / "deploy" / "chart" / "nodewright"


async def run(*argv: str, stdin: str = "") -> str:
    """Run a command; fail the test with its output unless it exits 0. Returns stdout."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin.encode())
    assert proc.returncode == 0, f"{' '.join(argv[:3])} failed: {err.decode()}{out.decode()}"
    return out.decode()


def _template_argv(extra: tuple[str, ...], bin_dir: Path | None) -> list[str]:
    helm = (bin_dir or default_bin_dir()) / "helm"
    return [
        str(helm),
        "template",
        "nw",
        str(CHART),
        "-n",
        "nodewright-system",
        "--kube-version",
        "1.36.3",
        *extra,
    ]


async def template(*extra: str, bin_dir: Path | None = None) -> str:
    """``helm template nw <chart> -n nodewright-system`` for Kubernetes 1.36.3, as text."""
    return await run(*_template_argv(extra, bin_dir))


async def template_error(*extra: str, bin_dir: Path | None = None) -> str:
    """The error output of a :func:`template` that must fail; fails the test if it renders."""
    proc = await asyncio.create_subprocess_exec(
        *_template_argv(extra, bin_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode != 0, f"the chart rendered:\n{out.decode()}"
    return err.decode()


async def render(*extra: str, bin_dir: Path | None = None) -> list[dict[str, Any]]:
    """The documents :func:`template` renders, parsed (empty ones dropped)."""
    text = await template(*extra, bin_dir=bin_dir)
    return [d for d in yaml.safe_load_all(text) if d]


async def server_dry_run(bin_dir: Path, kubeconfig: Path, text: str) -> list[str]:
    """``kubectl apply --server-side --dry-run=server`` of the manifests ``text``: the lines
    kubectl prints, sorted."""
    out = await run(
        str(bin_dir / "kubectl"),
        "--kubeconfig",
        str(kubeconfig),
        "apply",
        "--server-side",
        "--dry-run=server",
        "-f",
        "-",
        stdin=text,
    )
    return sorted(out.splitlines())


@dataclass(frozen=True)
class Ran:
    """A finished command: exit code, stdout, stderr."""

    code: int
    out: str
    err: str

    def ok(self) -> str:
        """stdout; fails the test with the output unless the command exited 0."""
        assert self.code == 0, f"exit {self.code}: {self.err}{self.out}"
        return self.out

    def failed(self) -> str:
        """stderr; fails the test unless the command exited non-zero."""
        assert self.code != 0, f"it succeeded:\n{self.out[:4000]}"
        return self.err


async def helm(*args: str, bin_dir: Path | None = None, env: dict[str, str] | None = None) -> Ran:
    """The rig's ``helm`` with exactly ``args`` (no implied ``--kube-version``), whatever it
    exits with."""
    proc = await asyncio.create_subprocess_exec(
        str((bin_dir or default_bin_dir()) / "helm"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())
