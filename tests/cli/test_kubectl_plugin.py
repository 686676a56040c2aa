"""The command line as a kubectl plugin and as kubectl users expect it, against the real API
server: ``kubectl nodewright ...`` through the rig's own kubectl, kubeconfig files merged
from a ``KUBECONFIG`` list and ``--context``, ``-o table|wide|json|yaml``, ``--dry-run`` on
changes (client and server side), ``version``, shell completion through kubectl, and one
line saying what to do for every problem (no kubeconfig, an unreachable server, a missing
NodeWright, no NATS): never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import yaml

from nodewright import manifests
from nodewright.rig import Rig
from shared import api, nodestate
from shared.kube import Kube, path_of
from tests.cli.conftest import Objects
from tests.helpers.accounts import account
from tests.helpers.cli import Result

PACKAGES = {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}}
BIN = Path(sys.executable).parent
"""Where pip installed nodewright's commands (kubectl-nodewright among them)."""


async def run(*argv: str, env: dict[str, str] | None = None, timeout_s: float = 60.0) -> Result:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


def one_line_problem(result: Result, *, code: int = 1) -> str:
    """The single line a failed command prints on stderr (no traceback, nothing else)."""
    assert result.code == code, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, f"not one line: {result.err!r}"
    assert lines[0].startswith("nodewright: "), lines[0]
    assert "Traceback" not in result.err
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_kubectl_runs_the_plugin_with_kubectls_flags(rig: Rig, objects: Objects) -> None:
    cr = (await objects.nodewright("plug", PACKAGES)).metadata.name
    node = await objects.node("n-a", cr)
    kubectl = str(rig.bin_dir / "kubectl")
    kc = str(rig.endpoints.kubeconfig)
    listed = await run(
        kubectl, "nodewright", "node", "list", "--nodewright", cr, "-o", "json", "--kubeconfig", kc
    )
    assert listed.code == 0, listed
    assert [r["node"] for r in json.loads(listed.out)["nodes"]] == [node]
    # Flags before the command, as `kubectl nodewright --kubeconfig ... plan X` passes them.
    plan = await run(kubectl, "nodewright", "--kubeconfig", kc, "plan", cr, "-o", "yaml")
    assert plan.code == 0, plan
    assert yaml.safe_load(plan.out)["nodewright"] == cr
    help_text = await run(kubectl, "nodewright", "--help")
    assert help_text.code == 0, help_text
    assert "Usage: kubectl nodewright" in help_text.out
    version = await run(kubectl, "nodewright", "version", "-o", "json", "--kubeconfig", kc)
    assert version.code == 0, version
    doc = json.loads(version.out)
    assert doc["server"]["gitVersion"] == "v1.36.3"
    assert doc["client"]["version"] == "0.1.0"
    assert doc["namespace"] == "nodewright-system"


async def test_version_reports_the_services_the_chart_installed(
    rig: Rig, kapi: Kube, namespace: str
) -> None:
    labels = {
        "app.kubernetes.io/name": "nodewright",
        "app.kubernetes.io/component": "status",
        "app.kubernetes.io/version": "0.1.0",
    }
    await kapi.create(
        path_of(group="apps", plural="deployments", namespace=namespace),
        {
            "metadata": {"name": "nodewright-status", "labels": labels},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app.kubernetes.io/component": "status"}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {"name": "status", "image": "ghcr.io/nvidia/nodewright:0.1.0"}
                        ]
                    },
                },
            },
        },
    )
    got = await run(
        sys.executable,
        "-m",
        "nodewright.cli",
        "version",
        "-n",
        namespace,
        "--kubeconfig",
        str(rig.endpoints.kubeconfig),
    )
    assert got.code == 0, got
    lines = got.out.splitlines()
    assert lines[0] == "Client version: 0.1.0"
    assert lines[1] == "API server version: v1.36.3"
    assert lines[2] == f"NodeWright services in namespace {namespace}:"
    assert lines[3].split() == ["SERVICE", "VERSION", "READY", "IMAGE"]
    assert lines[4].split() == ["status", "0.1.0", "0/2", "ghcr.io/nvidia/nodewright:0.1.0"]


async def test_a_kubeconfig_list_is_merged_as_kubectl_merges_it_and_context_picks(
    rig: Rig, objects: Objects, tmp_path: Path
) -> None:
    cr = (await objects.nodewright("merge", PACKAGES)).metadata.name
    rig_config = yaml.safe_load(rig.endpoints.kubeconfig.read_text())
    # First file: the current context is a cluster nobody listens on.
    dead = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "dead",
                "cluster": {
                    "server": f"https://127.0.0.1:{_free_port()}",
                    "insecure-skip-tls-verify": True,
                },
            }
        ],
        "users": [{"name": "nobody", "user": {"token": "x"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "nobody"}}],
        "current-context": "dead",
    }
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text(yaml.safe_dump(dead))
    second.write_text(yaml.safe_dump(rig_config))  # its current-context "rig" comes second
    env = {"KUBECONFIG": f"{first}:{second}", "HOME": str(tmp_path)}
    cmd = [sys.executable, "-m", "nodewright.cli", "node", "list", "--nodewright", cr]

    unreachable = one_line_problem(await run(*cmd, env=env))
    assert "cannot reach the API server at https://127.0.0.1:" in unreachable
    assert "--context" in unreachable
    picked = await run(*cmd, "--context", "rig", env=env)
    assert picked.code == 0, picked
    assert picked.out == f"NodeWright {cr} selects no node.\n"
    # The flag before the command works the same.
    before = await run(
        sys.executable, "-m", "nodewright.cli", "--context", "rig", *cmd[3:], env=env
    )
    assert before.code == 0, before
    missing = one_line_problem(await run(*cmd, "--context", "nope", env=env))
    assert "context nope is not in the kubeconfig" in missing
    assert "dead, rig" in missing
    only = await run(*cmd, "--kubeconfig", str(second), env=env)
    assert only.code == 0, only


async def test_without_any_kubeconfig_a_command_says_how_to_give_one(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}
    problem = one_line_problem(
        await run(
            sys.executable, "-m", "nodewright.cli", "node", "list", "--nodewright", "x", env=env
        )
    )
    assert problem == (
        "nodewright: no kubeconfig: pass --kubeconfig PATH, set KUBECONFIG, or create "
        "~/.kube/config (in a pod, the pod's service account is used)"
    )
    gone = one_line_problem(
        await run(
            sys.executable,
            "-m",
            "nodewright.cli",
            "plan",
            "x",
            "--kubeconfig",
            str(tmp_path / "nope"),
            env=env,
        )
    )
    assert "no such file" in gone


async def test_a_missing_nodewright_is_one_line_naming_where_to_look(
    rig: Rig, objects: Objects
) -> None:
    kc = str(rig.endpoints.kubeconfig)
    for args in (["plan", "nope"], ["pause", "nope"], ["node", "list", "--nodewright", "nope"]):
        problem = one_line_problem(
            await run(sys.executable, "-m", "nodewright.cli", *args, "--kubeconfig", kc)
        )
        assert problem.startswith("nodewright: NodeWright nope not found"), problem
        assert "kubectl get nodewrights" in problem


async def test_a_mistyped_command_line_is_one_line_pointing_at_the_help() -> None:
    problem = one_line_problem(
        await run(sys.executable, "-m", "nodewright.cli", "node", "lst"), code=2
    )
    assert "No such command 'lst'" in problem
    assert "`nodewright node --help`" in problem


async def test_a_dry_run_changes_nothing_on_the_client_or_the_server(
    rig: Rig, kapi: Kube, objects: Objects
) -> None:
    cr = (await objects.nodewright("dry", PACKAGES)).metadata.name
    node = await objects.node("n-a", cr)
    kc = str(rig.endpoints.kubeconfig)
    cli = [sys.executable, "-m", "nodewright.cli"]
    for mode, note in (
        ("--dry-run", "Dry run: nothing was sent to the API server, nothing changed."),
        (
            "--dry-run=server",
            "Server dry run: the API server accepted the change and stored nothing.",
        ),
    ):
        paused = await run(*cli, "pause", cr, mode, "--kubeconfig", kc)
        assert paused.code == 0, paused
        assert paused.out.startswith(f"Would have paused NodeWright {cr}")
        assert paused.out.splitlines()[-1] == note
        ignored = await run(*cli, "node", "ignore", node, mode, "--kubeconfig", kc)
        assert ignored.code == 0, ignored
        assert ignored.out.startswith(f"Would label node {node}")
        reset = await run(*cli, "reset-batches", cr, mode, "--kubeconfig", kc)
        assert reset.code == 0, reset
        everything = await run(*cli, "uninstall-all", mode, "--kubeconfig", kc)
        assert everything.code == 0, everything
        assert f"Would delete NodeWright {cr}." in everything.out
    assert api.PAUSE_ANNOTATION not in await objects.annotations(cr)
    raw = await kapi.get(f"{manifests.NODEWRIGHTS}/{cr}")
    assert "nodewright.nvidia.com/reset-batch-state" not in raw["metadata"].get("annotations", {})
    labels = (await kapi.get(path_of(plural="nodes", name=node)))["metadata"]["labels"]
    assert nodestate.IGNORE_LABEL not in labels
    # ... and the real thing does change it.
    done = await run(*cli, "pause", cr, "--kubeconfig", kc)
    assert done.code == 0, done
    assert (await objects.annotations(cr))[api.PAUSE_ANNOTATION] == "true"


async def test_a_server_dry_run_is_checked_by_the_api_server(
    rig: Rig, kapi: Kube, objects: Objects, namespace: str, tmp_path: Path
) -> None:
    """A server dry run goes through authorization and admission: a change the API server
    would refuse is refused, where a client dry run cannot know."""
    cr = (await objects.nodewright("srv", PACKAGES)).metadata.name
    reader = [{"apiGroups": [api.GROUP], "resources": ["nodewrights"], "verbs": ["get", "list"]}]
    async with account(
        rig, kapi, namespace=namespace, name="reader", rules=reader, directory=tmp_path
    ) as user:
        cli = [
            sys.executable,
            "-m",
            "nodewright.cli",
            "pause",
            cr,
            "--kubeconfig",
            str(user.kubeconfig),
        ]
        client_side = await run(*cli, "--dry-run")
        assert client_side.code == 0, client_side
        problem = one_line_problem(await run(*cli, "--dry-run=server"))
        assert "said 403" in problem
        assert "RBAC" in problem
    assert api.PAUSE_ANNOTATION not in await objects.annotations(cr)


async def test_listings_print_as_table_wide_json_and_yaml(rig: Rig, objects: Objects) -> None:
    cr = (await objects.nodewright("fmt", PACKAGES)).metadata.name
    node = await objects.node("n-a", cr)
    kc = str(rig.endpoints.kubeconfig)
    cli = [
        sys.executable,
        "-m",
        "nodewright.cli",
        "node",
        "list",
        "--nodewright",
        cr,
        "--kubeconfig",
        kc,
    ]
    table = await run(*cli)
    assert table.out.splitlines()[0].split() == ["NODE", "STATE", "TURN", "REASON", "PACKAGES"]
    wide = await run(*cli, "-o", "wide")
    assert wide.out.splitlines()[0].split()[4:] == [
        "COMPARTMENT",
        "BATCH",
        "ORDER",
        "CORDONED",
        "PACKAGES",
        "MESSAGE",
    ]
    as_json = json.loads((await run(*cli, "-o", "json")).out)
    as_yaml = yaml.safe_load((await run(*cli, "-o", "yaml")).out)
    assert as_json == as_yaml
    assert as_json["nodes"][0]["node"] == node
    pkg = [
        sys.executable,
        "-m",
        "nodewright.cli",
        "package",
        "status",
        "tuning",
        "--nodewright",
        cr,
        "--kubeconfig",
        kc,
    ]
    assert (await run(*pkg, "-o", "wide")).out.splitlines()[0].split()[-3:] == [
        "INSTALLED",
        "CHECK",
        "REASON",
    ]
    assert yaml.safe_load((await run(*pkg, "-o", "yaml")).out)["nodes"][0]["node"] == node


async def test_kubectl_completes_the_plugins_commands_and_nodewright_names(
    rig: Rig, objects: Objects
) -> None:
    cr = (await objects.nodewright("compl", PACKAGES)).metadata.name
    kubectl = str(rig.bin_dir / "kubectl")
    kc = str(rig.endpoints.kubeconfig)
    words = await run(kubectl, "__complete", "nodewright", "no")
    assert words.code == 0, words
    assert words.out.splitlines()[0].split("\t")[0] == "node"
    assert words.out.splitlines()[-1] == ":4"
    names = await run(kubectl, "__complete", "nodewright", "plan", "--kubeconfig", kc, cr[:6])
    assert cr in [line.split("\t")[0] for line in names.out.splitlines()], names
    # The shell's own completion of `nodewright`.
    script = await run(sys.executable, "-m", "nodewright.cli", "completion", "bash")
    assert script.code == 0, script
    assert "_NODEWRIGHT_COMPLETE=bash_complete" in script.out
    env = {
        "_NODEWRIGHT_COMPLETE": "bash_complete",
        "COMP_WORDS": "nodewright pa",
        "COMP_CWORD": "1",
    }
    offered = await run(str(BIN / "nodewright"), env=env)
    assert offered.code == 0, offered
    assert {"plain,package", "plain,pause"} <= set(offered.out.splitlines())


async def test_events_without_a_server_is_one_line_and_honours_nats_url() -> None:
    url = f"nats://127.0.0.1:{_free_port()}"
    started = asyncio.get_running_loop().time()
    problem = one_line_problem(
        await run(
            sys.executable, "-m", "nodewright.cli", "events", env={"NATS_URL": url}, timeout_s=30
        )
    )
    assert asyncio.get_running_loop().time() - started < 20, "it gave up in seconds"
    assert f"cannot connect to NATS at {url}" in problem
    assert "--server URL or set NATS_URL" in problem


async def test_events_on_a_server_without_the_stream_says_so(rig: Rig) -> None:
    problem = one_line_problem(
        await run(
            sys.executable,
            "-m",
            "nodewright.cli",
            "events",
            "--stream",
            "NO_SUCH_STREAM",
            env={"NATS_URL": rig.endpoints.nats_url},
            timeout_s=30,
        )
    )
    assert f"NATS at {rig.endpoints.nats_url} has no stream NO_SUCH_STREAM" in problem
