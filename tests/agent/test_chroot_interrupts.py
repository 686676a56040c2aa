"""Interrupts run chrooted in the test root filesystem, where ``reboot`` and ``systemctl`` are
stand-ins that record their calls (see conftest)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from tests.agent.harness import BOOT_ID, CALLS_DIR, Node, calls

pytestmark = pytest.mark.timeout(120, func_only=True)


def new_id() -> str:
    return f"int-{uuid.uuid4().hex[:12]}"


def interrupt(
    node: Node, spec: Mapping[str, object], interrupt_id: str
) -> tuple[int, dict[str, Any]]:
    result = node.run(
        "interrupt", None, "--interrupt", json.dumps(spec), "--interrupt-id", interrupt_id
    )
    assert result.result is not None, result.stderr
    return result.returncode, result.result


def test_a_service_interrupt_reloads_then_restarts_each_service_once_per_interrupt_id(
    node: Node,
) -> None:
    first_id, second_id = new_id(), new_id()
    spec = {"type": "service", "services": ["containerd.service", "kubelet"]}

    rc, result = interrupt(node, spec, first_id)
    again_rc, again = interrupt(node, spec, first_id)
    other_rc, _ = interrupt(node, spec, second_id)

    assert (rc, again_rc, other_rc) == (0, 0, 0)
    expected = [
        "systemctl daemon-reload",
        "systemctl restart containerd.service",
        "systemctl restart kubelet",
    ]
    assert calls(node, first_id) == expected
    assert calls(node, second_id) == expected
    assert result["interrupt"] == {
        "type": "service",
        "id": first_id,
        "status": "done",
        "commands": [
            {"command": "daemon-reload", "rc": 0},
            {"command": "restart-containerd.service", "rc": 0},
            {"command": "restart-kubelet", "rc": 0},
        ],
    }
    assert all(c.get("skipped") for c in again["interrupt"]["commands"])
    flags = sorted(p.name for p in (node.state / "interrupts" / first_id).iterdir())
    assert flags == [
        "daemon-reload.json",
        "restart-containerd.service.json",
        "restart-kubelet.json",
    ]
    (log,) = (node.logs / "interrupts" / first_id / "restart-kubelet").iterdir()
    assert "run ['systemctl', 'restart', 'kubelet']" in log.read_text()
    assert log.read_text().rstrip().endswith("exit 0")


def test_a_failed_service_restart_fails_the_interrupt_and_is_retried_next_time(node: Node) -> None:
    interrupt_id = new_id()
    spec = {"type": "service", "services": ["a.service", "broken.service", "c.service"]}
    failing = node.host(f"{CALLS_DIR}/fail-broken.service")
    failing.touch()
    try:
        rc, result = interrupt(node, spec, interrupt_id)
    finally:
        failing.unlink()
    retry_rc, retry = interrupt(node, spec, interrupt_id)

    assert rc == 1
    assert result["failed_step"] == "restart-broken.service"
    assert "Job for broken.service failed." in result["tail"]
    assert retry_rc == 0
    assert retry["interrupt"]["status"] == "done"
    # The commands that succeeded are not repeated; the failed one and the rest run on retry.
    assert calls(node, interrupt_id) == [
        "systemctl daemon-reload",
        "systemctl restart a.service",
        "systemctl restart broken.service",
        "systemctl restart broken.service",
        "systemctl restart c.service",
    ]


def test_a_reboot_is_issued_once_and_recorded_with_the_boot_id_not_judged_by_exit_code(
    node: Node,
) -> None:
    interrupt_id = new_id()
    boot_id = BOOT_ID.read_text().strip()

    first = node.run(
        "interrupt", None, "--interrupt", '{"type": "reboot"}', "--interrupt-id", interrupt_id
    )
    rc, result = first.returncode, first.result or {}
    again_rc, again = interrupt(node, {"type": "reboot"}, interrupt_id)

    assert rc == 0
    assert calls(node, interrupt_id) == ["reboot "]
    assert result["interrupt"] == {
        "type": "reboot",
        "id": interrupt_id,
        "status": "reboot-issued",
        "boot_id_before": boot_id,
        "commands": [{"command": "reboot", "rc": 0}],
    }
    # The result was written before `reboot` ran, in case the shutdown kills the agent.
    (provisional,) = first.of("result.provisional")
    assert provisional["result"]["interrupt"]["status"] == "reboot-issued"
    assert provisional["ts"] < first.of("interrupt.command.started")[0]["ts"]
    assert len(first.of("agent.finished")) == 1
    # The pod restarted after the reboot: the reboot is not issued again, and the result
    # hands both boot IDs to whoever judges it (the validator compares the node's boot ID).
    assert again_rc == 0
    assert again["interrupt"]["status"] == "reboot-already-issued"
    assert again["interrupt"]["boot_id_before"] == boot_id
    assert again["interrupt"]["boot_id_now"] == boot_id
    flag = json.loads((node.state / "interrupts" / interrupt_id / "reboot.json").read_text())
    assert flag["boot_id"] == boot_id


def test_restart_all_services_restarts_running_services_except_system_plumbing(
    node: Node,
) -> None:
    interrupt_id = new_id()

    rc, _ = interrupt(node, {"type": "restartAllServices"}, interrupt_id)

    assert rc == 0
    assert calls(node, interrupt_id) == [
        "systemctl list-units --type=service --state=running --plain --no-legend --no-pager",
        "systemctl daemon-reload",
        "systemctl restart containerd.service",
        "systemctl restart kubelet.service",
    ]


def test_a_noop_interrupt_only_leaves_its_flag(node: Node) -> None:
    interrupt_id = new_id()

    rc, result = interrupt(node, {"type": "noop"}, interrupt_id)

    assert rc == 0
    assert calls(node, interrupt_id) == []
    assert result["interrupt"]["status"] == "done"
    assert (node.state / "interrupts" / interrupt_id / "noop.json").exists()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        pytest.param({"type": "service", "services": []}, "non-empty", id="service-without-list"),
        pytest.param(
            {"type": "service", "services": ["--force"]}, "unit names", id="option-injection"
        ),
        pytest.param({"type": "reboot", "services": ["x"]}, "takes no", id="reboot-with-services"),
        pytest.param({"type": "restart"}, "not one of", id="unknown-type"),
    ],
)
def test_an_invalid_interrupt_is_a_usage_error_and_runs_nothing(
    node: Node, spec: dict[str, object], fragment: str
) -> None:
    interrupt_id = new_id()

    rc, result = interrupt(node, spec, interrupt_id)

    assert rc == 2
    assert fragment in str(result["error"])
    assert calls(node, interrupt_id) == []
