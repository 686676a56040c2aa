"""The ``nodewright`` command line, also installed as the kubectl plugin ``kubectl-nodewright``
(``kubectl nodewright ...``): every command, its options and help, and how it fails.

Commands (docs/cli.md describes each):
  version, completion
  sandbox        run NodeWright locally on simulated nodes, with a live view of a rollout
  events         follow the event stream (CloudEvents), decoded
  plan           dry run of a rollout's batches; reset-batches starts them over
  approve        let a rollout go on after a batch its policy gates
  pause/resume, disable/enable
  node           list a NodeWright's nodes; status, retry, reset, abort, ignore, unignore one
  package        validate a package directory; status, logs (-f), rerun on nodes
  uninstall-all  delete every NodeWright and DeploymentPolicy before removing NodeWright

It is built on click: kubectl's flags (``--kubeconfig``, ``--context``, ``-n``) before or
after the command, ``-o table|wide|json|yaml`` on listings, ``--dry-run[=client|server]`` on
every change, shell completion (``nodewright completion bash``; kubectl completes the plugin
through ``kubectl_complete-nodewright``). Every problem is one line on stderr starting
``nodewright:`` that says what to do next, exit code 1 (2 for a mistyped command line);
never a traceback (``NODEWRIGHT_DEBUG=1`` shows one for an unexpected error).

This module imports only click and the standard library: each command imports what it runs
(the ``*_cmd`` modules, kubernetes_asyncio, nats) when it runs, so ``--help``, ``version
--client`` and ``completion`` start fast. What a command does is its module's business.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast

import click

F = TypeVar("F", bound=Callable[..., Any])

FORMATS: Final = ("table", "wide", "json", "yaml")
DOCUMENT_FORMATS: Final = ("table", "json", "yaml")
DEFAULT_NAMESPACE: Final = "nodewright-system"
"""The services' namespace (shared.config.ServiceSettings.namespace; the chart's default)."""
NATS_DEFAULT: Final = "nats://127.0.0.1:4222"
RERUN_STAGES: Final = ("apply", "upgrade", "config", "post-interrupt")
"""shared.nodestate.RERUN_STAGES, repeated so that parsing imports nothing (a test checks)."""
LOG_STAGES: Final = (*RERUN_STAGES, "uninstall")
"""package_cmd.STAGES (a test checks)."""
DryRun = Literal["none", "client", "server"]


def prog_name(argv0: str) -> str:
    """``kubectl nodewright`` when run as the kubectl plugin, else ``nodewright``."""
    base = Path(argv0).name
    return "kubectl nodewright" if base.startswith("kubectl-") else "nodewright"


# ---- options every command of a kind shares ---------------------------------------------


def _remember_namespace(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta["nodewright.namespace"] = value


def kube_options(f: F) -> F:
    """kubectl's flags, accepted after the command too (``node list --context x -n ns``); a
    command that reads nothing namespaced accepts ``-n`` as kubectl does, and ignores it."""
    f = click.option(
        "-n",
        "--namespace",
        default=None,
        metavar="NAMESPACE",
        expose_value=False,
        callback=_remember_namespace,
        help=f"Namespace of NodeWright's services and pods (default: {DEFAULT_NAMESPACE}).",
    )(f)
    f = click.option(
        "--context",
        default=None,
        metavar="NAME",
        help="The kubeconfig context to use (default: its current-context).",
    )(f)
    f = click.option(
        "--kubeconfig",
        default=None,
        metavar="PATH",
        help="Kubeconfig file (default: the $KUBECONFIG list, ~/.kube/config, else in-cluster).",
    )(f)
    return f


def output_option(formats: Sequence[str] = FORMATS) -> Callable[[F], F]:
    return click.option(
        "-o",
        "--output",
        "fmt",
        type=click.Choice(formats),
        default="table",
        show_default=True,
        help="Output format: a table (wide: more columns), or a document for tools.",
    )


def dry_run_option(f: F) -> F:
    return click.option(
        "--dry-run",
        type=click.Choice(["none", "client", "server"]),
        default="none",
        is_flag=False,
        flag_value="client",
        show_default=True,
        help="Change nothing: client (--dry-run) sends nothing and says what would change; "
        "server sends it with dryRun=All, so the API server checks and stores nothing.",
    )(f)


def namespace_option(f: F) -> F:
    return click.option(
        "-n",
        "--namespace",
        default=None,
        metavar="NAMESPACE",
        help=f"Namespace of NodeWright's services and pods (default: {DEFAULT_NAMESPACE}).",
    )(f)


def _target(ctx: click.Context, kubeconfig: str | None, context: str | None) -> Any:
    from nodewright.connecting import Target

    root = ctx.find_root().params
    return Target(
        kubeconfig=kubeconfig or root.get("kubeconfig") or "",
        context=context or root.get("context") or "",
    )


def _namespace(ctx: click.Context) -> str:
    """``-n`` after the command, else before it, else the chart's default."""
    return (
        ctx.meta.get("nodewright.namespace")
        or ctx.find_root().params.get("namespace")
        or DEFAULT_NAMESPACE
    )


def _complete_names(plural: str) -> Callable[[click.Context, click.Parameter, str], list[str]]:
    """Shell completion of object names (NodeWrights, nodes) from the cluster; nothing when
    it does not answer within a couple of seconds."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
        try:
            from nodewright.connecting import names

            target = _target(ctx, ctx.params.get("kubeconfig"), ctx.params.get("context"))
            return [n for n in names(target, plural) if n.startswith(incomplete)]
        except Exception:
            return []

    return complete


NODEWRIGHT_NAMES = _complete_names("nodewrights")
NODE_NAMES = _complete_names("nodes")


# ---- the root -----------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--kubeconfig", default=None, metavar="PATH", help="Kubeconfig file.")
@click.option("--context", default=None, metavar="NAME", help="The kubeconfig context to use.")
@namespace_option
def cli(kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
    """NodeWright: a Kubernetes-native package manager for the host layer.

    Roll versioned host packages across node fleets in batches, without killing protected
    workloads. docs/cli.md describes every command.
    """


@cli.command()
@click.option("--client", "client_only", is_flag=True, help="Only the command line's version.")
@output_option(DOCUMENT_FORMATS)
@kube_options
@click.pass_context
def version(
    ctx: click.Context,
    client_only: bool,
    fmt: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Print the versions of this command, the API server and NodeWright's services."""
    if client_only and fmt == "table":
        # The one command that must be instant: no client library is imported.
        from nodewright import version_cmd

        click.echo(f"Client version: {version_cmd.client_version()}")
        return
    from nodewright import version_cmd

    version_cmd.run_version(
        _target(ctx, kubeconfig, context),
        client_only=client_only,
        namespace=_namespace(ctx),
        fmt=cast(Any, fmt),
    )


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script: eval "$(nodewright completion bash)".

    kubectl completes `kubectl nodewright ...` by itself (kubectl 1.26 or later) through the
    kubectl_complete-nodewright command installed with this one.
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None  # click ships all three
    root = ctx.find_root()
    name = root.info_name or "nodewright"
    var = f"_{name.replace('-', '_').replace(' ', '_').upper()}_COMPLETE"
    click.echo(cls(root.command, {}, name, var).source())


@cli.command()
@click.option(
    "--gpu-nodes", type=int, default=30, show_default=True, help="Simulated nodepool=gpu nodes."
)
@click.option(
    "--cpu-nodes", type=int, default=10, show_default=True, help="Simulated nodepool=cpu nodes."
)
@click.option(
    "--stage-duration",
    default="2s",
    show_default=True,
    help="How long each simulated package stage runs (Go duration).",
)
@click.option(
    "--exit-when-ready",
    is_flag=True,
    help="Stop everything once the example NodeWright is Ready (for scripts and CI).",
)
@click.option(
    "--timeout",
    type=float,
    default=900.0,
    show_default=True,
    help="Give up after this many seconds.",
)
@click.option(
    "--real-node",
    is_flag=True,
    help="Also start one REAL node (containerd + kubelet in namespaces of its own; needs root "
    "and `make images`) and run the example package sysctl-tuning on it for real.",
)
@click.option(
    "--helm",
    is_flag=True,
    help="Install as a user does instead of running the services as processes: the official "
    "NATS chart (three JetStream servers) and deploy/chart/nodewright with Helm, as pods on "
    "two REAL nodes (needs root and `make images`). Package stages then take the chart's "
    "simulated duration (1s), not --stage-duration.",
)
@click.option(
    "--nats-chart",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="PATH",
    help="The official NATS chart 2.14.2 (.tgz) for --helm "
    "[default: $NODEWRIGHT_NATS_CHART, else ../shared/vendor/charts/nats-2.14.2.tgz].",
)
def sandbox(
    gpu_nodes: int,
    cpu_nodes: int,
    stage_duration: str,
    exit_when_ready: bool,
    timeout: float,
    real_node: bool,
    helm: bool,
    nats_chart: Path | None,
) -> int:
    """Run NodeWright locally on simulated nodes, with a live view of a rollout.

    Starts a local control plane and NATS, the five services and simulated (kwok) nodes,
    applies the example NodeWright and shows its rollout. Nothing on this machine changes.
    Ctrl-C stops everything it started.
    """
    from nodewright import sandbox as sandbox_

    if helm and real_node:
        raise click.UsageError(
            "--helm and --real-node cannot be combined: --helm already runs two real nodes "
            "(for NATS and NodeWright's pods); drop one of them"
        )
    if nats_chart is not None and not helm:
        raise click.UsageError("--nats-chart is for --helm only: add --helm or drop it")
    return sandbox_.run(
        gpu_nodes=gpu_nodes,
        cpu_nodes=cpu_nodes,
        stage_duration=stage_duration,
        exit_when_ready=exit_when_ready,
        timeout_s=timeout,
        real_node=real_node,
        helm=helm,
        nats_chart=nats_chart,
    )


@cli.command()
@click.option(
    "--server",
    envvar="NATS_URL",
    default=NATS_DEFAULT,
    show_default=True,
    metavar="URL",
    help="NATS URL (default: $NATS_URL, as the nats CLI reads it).",
)
@click.option("--stream", default="NODEWRIGHT", show_default=True, help="JetStream stream name.")
@click.option("--nodewright", default="", metavar="NAME", help="Only events of this NodeWright.")
@click.option("--node", default="", metavar="NODE", help="Only events about this node.")
@click.option("--all", "replay", is_flag=True, help="Replay the stored history first.")
@click.option(
    "--user",
    envvar="NATS_USER",
    default="",
    metavar="USER",
    help="NATS user (the operators' reader: nodewright-reader; default: $NATS_USER).",
)
@click.option(
    "--password-file",
    default="",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="File holding the user's password (Secret nodewright-nats-users-reader).",
)
@click.option(
    "--tls-ca",
    envvar="NATS_CA",
    default="",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="CA certificate to verify a TLS NATS server (default: $NATS_CA).",
)
@output_option()
def events(
    server: str,
    stream: str,
    nodewright: str,
    node: str,
    replay: bool,
    user: str,
    password_file: str,
    tls_ca: str,
    fmt: str,
) -> None:
    """Follow NodeWright's event stream, one line per event (json/yaml: CloudEvents)."""
    from nodewright import events_cmd

    events_cmd.run(
        server=server,
        stream=stream,
        nodewright=nodewright,
        node=node,
        replay=replay,
        fmt=cast(Any, fmt),
        login=events_cmd.Login(user=user, password_file=password_file, tls_ca=tls_ca),
    )


@cli.command("nats-users")
@click.option(
    "--out",
    required=True,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Directory to write nats-users-values.yaml and nodewright-nats-users.yaml into.",
)
@click.option(
    "--secret",
    default="nodewright-nats-users",
    show_default=True,
    help="Name of the Secret with the services' passwords (the chart's nats.auth.secretName).",
)
@click.option(
    "-n",
    "--namespace",
    default="nodewright-system",
    show_default=True,
    help="NodeWright's namespace (where the Secrets go).",
)
@click.option("--stream", default="NODEWRIGHT", show_default=True, help="JetStream stream name.")
def nats_users(out: str, secret: str, namespace: str, stream: str) -> None:
    """Make NATS users for an install: one per service and a read-only reader.

    Writes the official NATS chart's values (bcrypt hashes and each user's permissions) and
    the Secrets with the passwords (random; a new run makes new ones). docs/install.md,
    "NATS users", says how to apply them.
    """
    from pathlib import Path

    from nodewright import natsusers

    try:
        values, secrets_file = natsusers.write(
            Path(out), secret=secret, namespace=namespace, stream=stream
        )
    except OSError as exc:
        raise click.ClickException(f"cannot write into {out}: {exc.strerror}") from None
    click.echo(
        f"Wrote {values} (NATS chart values: bcrypt hashes only) and {secrets_file} (the "
        "passwords: apply it, keep it out of Git). Next:\n"
        f"  kubectl apply -f {secrets_file}\n"
        f"  helm upgrade nats nats/nats -n nats -f deploy/nats/values.yaml -f {values}\n"
        f"  helm upgrade --install nodewright deploy/chart/nodewright -n {namespace} "
        f"--set nats.auth.secretName={secret}"
    )


@cli.command()
@click.argument("name", shell_complete=NODEWRIGHT_NAMES)
@output_option()
@kube_options
@click.pass_context
def plan(
    ctx: click.Context, name: str, fmt: str, kubeconfig: str | None, context: str | None
) -> None:
    """Dry run: the batches a NodeWright's rollout will run from its current state."""
    from nodewright import plan_cmd

    plan_cmd.run_plan(_target(ctx, kubeconfig, context), name, cast(Any, fmt))


@cli.command("reset-batches")
@click.argument("name", shell_complete=NODEWRIGHT_NAMES)
@dry_run_option
@kube_options
@click.pass_context
def reset_batches(
    ctx: click.Context, name: str, dry_run: DryRun, kubeconfig: str | None, context: str | None
) -> None:
    """Start every compartment of a NodeWright at batch 1 again."""
    from nodewright import plan_cmd

    plan_cmd.run_reset(_target(ctx, kubeconfig, context), name, dry_run)


@cli.command()
@click.argument("name", shell_complete=NODEWRIGHT_NAMES)
@click.option(
    "--compartment",
    default=None,
    metavar="NAME",
    help="approve this compartment only (default: every compartment waiting for approval)",
)
@dry_run_option
@kube_options
@click.pass_context
def approve(
    ctx: click.Context,
    name: str,
    compartment: str | None,
    dry_run: DryRun,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Let a rollout go on after a batch its policy gates (approvalAfterBatches)."""
    from nodewright import plan_cmd

    plan_cmd.run_approve(_target(ctx, kubeconfig, context), name, compartment, dry_run)


def _switch(verb: str, text: str) -> None:
    @cli.command(verb, help=text, short_help=text.split(":")[0])
    @click.argument("name", shell_complete=NODEWRIGHT_NAMES)
    @dry_run_option
    @kube_options
    @click.pass_context
    def command(
        ctx: click.Context, name: str, dry_run: DryRun, kubeconfig: str | None, context: str | None
    ) -> None:
        from nodewright import lifecycle_cmd

        lifecycle_cmd.run_switch(_target(ctx, kubeconfig, context), verb, name, dry_run=dry_run)


SWITCH_HELP: Final = {
    "pause": "Pause a NodeWright's rollout: nothing new starts, work in progress finishes.",
    "resume": "Resume a paused NodeWright's rollout.",
    "disable": "Disable a NodeWright: it is skipped until it is enabled again.",
    "enable": "Enable a disabled NodeWright again.",
}
for _verb, _text in SWITCH_HELP.items():
    _switch(_verb, _text)


# ---- node ---------------------------------------------------------------------------------


@cli.group()
def node() -> None:
    """List a NodeWright's nodes; look at one node and recover it."""


@node.command("list")
@click.option(
    "--nodewright",
    required=True,
    metavar="NAME",
    shell_complete=NODEWRIGHT_NAMES,
    help="The NodeWright.",
)
@output_option()
@kube_options
@click.pass_context
def node_list(
    ctx: click.Context, nodewright: str, fmt: str, kubeconfig: str | None, context: str | None
) -> None:
    """List a NodeWright's target nodes: state, turn, reason and packages of each."""
    from nodewright import node_cmd

    node_cmd.run_verb(
        _target(ctx, kubeconfig, context),
        "list",
        nodewright=nodewright,
        fmt=cast(Any, fmt),
        namespace=_namespace(ctx),
    )


_ONLY_HELP: Final = "Only this NodeWright (default: every NodeWright with state on the node)."


@node.command("status")
@click.argument("node_name", metavar="NODE", shell_complete=NODE_NAMES)
@click.option("--nodewright", default="", metavar="NAME", help=_ONLY_HELP)
@kube_options
@click.pass_context
def node_status(
    ctx: click.Context, node_name: str, nodewright: str, kubeconfig: str | None, context: str | None
) -> None:
    """Show where each NodeWright stands on the node."""
    from nodewright import node_cmd

    node_cmd.run_verb(
        _target(ctx, kubeconfig, context),
        "status",
        node=node_name,
        nodewright=nodewright,
        namespace=_namespace(ctx),
    )


def _recovery(verb: Literal["retry", "reset"], text: str) -> None:
    @node.command(verb, help=text)
    @click.argument("node_name", metavar="NODE", shell_complete=NODE_NAMES)
    @click.option("--nodewright", default="", metavar="NAME", help=_ONLY_HELP)
    @dry_run_option
    @kube_options
    @click.pass_context
    def command(
        ctx: click.Context,
        node_name: str,
        nodewright: str,
        dry_run: DryRun,
        kubeconfig: str | None,
        context: str | None,
    ) -> None:
        from nodewright import node_cmd

        node_cmd.run_verb(
            _target(ctx, kubeconfig, context),
            verb,
            node=node_name,
            nodewright=nodewright,
            dry_run=dry_run,
        )


_recovery("retry", "Run what failed on the node again, as a new attempt.")
_recovery("reset", "Forget a NodeWright's progress on the node: it starts over.")


@node.command("abort")
@click.argument("node_name", metavar="NODE", shell_complete=NODE_NAMES)
@click.option("--nodewright", default="", metavar="NAME", help=_ONLY_HELP)
@click.option(
    "--package",
    default="",
    metavar="NAME",
    help="Only this package's stage (default: every stage running on the node).",
)
@dry_run_option
@kube_options
@click.pass_context
def node_abort(
    ctx: click.Context,
    node_name: str,
    nodewright: str,
    package: str,
    dry_run: DryRun,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Fail what runs on the node now (reason StageAborted); its pod is stopped, kept for
    its logs. `node retry` runs it again."""
    from nodewright import node_cmd

    node_cmd.run_abort(
        _target(ctx, kubeconfig, context),
        node=node_name,
        nodewright=nodewright,
        package=package,
        dry_run=dry_run,
        namespace=_namespace(ctx),
    )


def _labelling(verb: Literal["ignore", "unignore"], text: str) -> None:
    @node.command(verb, help=text)
    @click.argument("node_name", metavar="NODE", shell_complete=NODE_NAMES)
    @dry_run_option
    @kube_options
    @click.pass_context
    def command(
        ctx: click.Context,
        node_name: str,
        dry_run: DryRun,
        kubeconfig: str | None,
        context: str | None,
    ) -> None:
        from nodewright import node_cmd

        node_cmd.run_verb(_target(ctx, kubeconfig, context), verb, node=node_name, dry_run=dry_run)


_labelling("ignore", "Label the node so NodeWright admits it to no rollout.")
_labelling("unignore", "Remove the ignore label from the node.")


# ---- package ------------------------------------------------------------------------------


@cli.group()
def package() -> None:
    """Validate a package; its status, logs and reruns on nodes."""


@package.command("validate")
@click.argument("package_dir", metavar="DIR|ARCHIVE")
@output_option(DOCUMENT_FORMATS)
def package_validate(package_dir: str, fmt: str) -> int:
    """Check a package directory, or a built image (oci-archive:FILE, docker-archive:FILE or
    FILE.tar), before it is published (exit 3 when it is invalid)."""
    from nodewright import package_cmd

    return package_cmd.run_validate(package_dir, cast(Any, fmt))


@package.command("status")
@click.argument("name")
@click.option(
    "--nodewright",
    required=True,
    metavar="NAME",
    shell_complete=NODEWRIGHT_NAMES,
    help="The NodeWright.",
)
@click.option(
    "--node",
    "nodes",
    multiple=True,
    metavar="NODE",
    shell_complete=NODE_NAMES,
    help="Only this node (repeatable; default: every target node of the NodeWright).",
)
@output_option()
@kube_options
@click.pass_context
def package_status(
    ctx: click.Context,
    name: str,
    nodewright: str,
    nodes: tuple[str, ...],
    fmt: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Show where a package stands on each node of a NodeWright."""
    from nodewright import package_cmd

    package_cmd.run_status(
        _target(ctx, kubeconfig, context),
        name,
        nodewright=nodewright,
        nodes=nodes,
        fmt=cast(Any, fmt),
    )


@package.command("logs")
@click.argument("name")
@click.option(
    "--node",
    "node_name",
    required=True,
    metavar="NODE",
    shell_complete=NODE_NAMES,
    help="The node.",
)
@click.option("--nodewright", default="", metavar="NAME", help="Only pods of this NodeWright.")
@click.option(
    "--stage", default="", type=click.Choice(["", *LOG_STAGES]), help="Only pods of this stage."
)
@click.option(
    "--tail",
    type=int,
    default=-1,
    show_default=True,
    metavar="N",
    help="The last N lines of each log (-1: all).",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing the logs of pods still running.")
@click.option(
    "--raw",
    is_flag=True,
    help="The agent's lines as it wrote them (one JSON object each), not rendered.",
)
@kube_options
@click.pass_context
def package_logs(
    ctx: click.Context,
    name: str,
    node_name: str,
    nodewright: str,
    stage: str,
    tail: int,
    follow: bool,
    raw: bool,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Print the logs of a package's stages and their checks on a node."""
    from nodewright import package_cmd

    package_cmd.run_logs(
        _target(ctx, kubeconfig, context),
        name,
        node=node_name,
        nodewright=nodewright,
        stage=stage,
        tail=tail,
        follow=follow,
        raw=raw,
        namespace=_namespace(ctx),
    )


@package.command("rerun")
@click.argument("name")
@click.option(
    "--node",
    "node_name",
    required=True,
    metavar="NODE",
    shell_complete=NODE_NAMES,
    help="The node.",
)
@click.option(
    "--nodewright",
    default="",
    metavar="NAME",
    help="The NodeWright (needed when several have the package).",
)
@click.option(
    "--stage",
    default="",
    type=click.Choice(["", *RERUN_STAGES]),
    help="Run only this stage and the ones after it (default: the whole cycle).",
)
@dry_run_option
@kube_options
@click.pass_context
def package_rerun(
    ctx: click.Context,
    name: str,
    node_name: str,
    nodewright: str,
    stage: str,
    dry_run: DryRun,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Run a package's cycle (or one stage of it) again on a node."""
    from nodewright import package_cmd

    package_cmd.run_rerun(
        _target(ctx, kubeconfig, context),
        name,
        node=node_name,
        nodewright=nodewright,
        stage=stage,
        dry_run=dry_run,
    )


@cli.command("uninstall-all")
@click.option(
    "--wait",
    is_flag=True,
    help="Wait until every NodeWright is gone, saying what each waits for, then delete the "
    "DeploymentPolicies (without it they are deleted only if no NodeWright is left).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    metavar="SECONDS",
    help="With --wait: give up (exit 1) after this long.",
)
@dry_run_option
@kube_options
@click.pass_context
def uninstall_all(
    ctx: click.Context,
    wait: bool,
    timeout: float,
    dry_run: DryRun,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Delete every NodeWright (their finalizers uninstall their packages), then every
    DeploymentPolicy: before removing NodeWright itself."""
    from nodewright import teardown_cmd

    teardown_cmd.run_uninstall_all(
        _target(ctx, kubeconfig, context), wait=wait, timeout_s=timeout, dry_run=dry_run
    )


# ---- entry points -------------------------------------------------------------------------


def _fail(text: str, code: int) -> int:
    with contextlib.suppress(OSError):  # stderr is gone too: the exit code says it
        print(f"nodewright: {text}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return its exit code. Never raises, never prints a traceback
    (unless NODEWRIGHT_DEBUG=1 and the error is unexpected)."""
    from nodewright.connecting import CommandError

    name = prog_name(sys.argv[0] if argv is None else "nodewright")
    args = list(sys.argv[1:] if argv is None else argv)
    # The services' modules log what a service operator reads (e.g. "Lost the Kubernetes API
    # server"), and asyncio and nats-py warn about their connections; a command says what
    # went wrong once, in its one line (CommandError). Without a handler, Python would print
    # those warnings on stderr beside it. The services run as processes of their own, with
    # their own logging.
    logging.getLogger().addHandler(logging.NullHandler())
    try:
        code = cli.main(args=args, prog_name=name, standalone_mode=False)
    except CommandError as exc:
        return _fail(str(exc), 1)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help(), err=True)
        return 2
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else name
        return _fail(f"{exc.format_message()} (see `{where} --help`)", 2)
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except click.exceptions.Abort:
        return _fail("interrupted", 130)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except SystemExit as exc:
        return (
            exc.code
            if isinstance(exc.code, int)
            else (0 if exc.code is None else _fail(str(exc.code), 1))
        )
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`nodewright node list | head -1`): nothing more to say.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:
        if os.environ.get("NODEWRIGHT_DEBUG") == "1":
            raise
        return _fail(
            f"unexpected error: {type(exc).__name__}: {exc} (run again with NODEWRIGHT_DEBUG=1 "
            "for the traceback, and report it)",
            1,
        )
    return code if isinstance(code, int) else 0


def kubectl_complete() -> int:
    """``kubectl_complete-nodewright``: what kubectl runs to complete ``kubectl nodewright``
    (its arguments so far, then the word being completed). Answers as cobra's ``__complete``
    does: one ``value<TAB>help`` per line, then ``:<directive>`` (4: no file names; 0: files
    are fine)."""
    from click.shell_completion import ShellComplete

    words = sys.argv[1:]
    incomplete = words[-1] if words else ""
    completer = ShellComplete(cli, {}, "kubectl nodewright", "_KUBECTL_NODEWRIGHT_COMPLETE")
    items = completer.get_completions(words[:-1], incomplete)
    for item in items:
        help_text = (item.help or "").splitlines()[0] if item.help else ""
        print(f"{item.value}\t{help_text}" if help_text else item.value)
    files = any(item.type in ("file", "dir") for item in items)
    print(":0" if files else ":4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
