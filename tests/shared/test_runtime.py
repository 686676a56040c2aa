"""The supervisor stops cleanly, gives graceful tasks their time, and treats a root task
that ends as a crash; the config loader names the variable at fault."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from services import __main__ as together
from services.drainer.config import Settings as DrainerSettings
from services.validator.config import Settings as ValidatorSettings
from shared import collectors, config, runtime


async def test_sigterm_cancels_caches_at_once_and_lets_graceful_tasks_finish() -> None:
    sup = runtime.Supervisor(name="t", graceful_timeout_s=5)
    log: list[str] = []

    async def cache() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            log.append("cache cancelled")
            raise

    async def consumer() -> None:
        await sup.stopping.wait()
        await asyncio.sleep(0.2)  # in-flight work
        log.append("consumer drained")

    sup.add("cache", cache)
    sup.add("consumer", consumer, graceful=True)
    run = asyncio.create_task(sup.run())
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(run, 5) == 0
    assert log == ["cache cancelled", "consumer drained"]


async def test_a_root_task_that_fails_stops_the_service_with_exit_code_1() -> None:
    sup = runtime.Supervisor(name="t", graceful_timeout_s=1)

    async def boom() -> None:
        raise RuntimeError("boom")

    async def forever() -> None:
        await asyncio.Event().wait()

    sup.add("boom", boom)
    sup.add("forever", forever)
    assert await asyncio.wait_for(sup.run(), 5) == 1


def test_config_decodes_groups_and_rejects_unknown_or_bad_variables() -> None:
    s = config.load(
        config.ServiceSettings,
        {"NODEWRIGHT_NATS_URL": "nats://x:1", "NODEWRIGHT_HEALTH_PORT": "9000", "HOME": "/x"},
    )
    assert s.nats.url == "nats://x:1"
    assert s.health.port == 9000
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_NATS_URLS"):
        config.load(config.ServiceSettings, {"NODEWRIGHT_NATS_URLS": "x"})
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_HEALTH_PORT"):
        config.load(config.ServiceSettings, {"NODEWRIGHT_HEALTH_PORT": "70000"})


def test_kubernetes_service_link_variables_are_not_settings() -> None:
    """kubelet gives every pod variables for each Service of its namespace: the chart's
    Services nodewright-validator and nodewright-scheduler-metrics make NODEWRIGHT_* ones (a
    real install crashed on them); a misspelt setting that merely looks like one still fails."""
    links = {
        "NODEWRIGHT_VALIDATOR_SERVICE_HOST": "10.0.0.7",
        "NODEWRIGHT_VALIDATOR_SERVICE_PORT": "443",
        "NODEWRIGHT_VALIDATOR_SERVICE_PORT_WEBHOOK": "443",
        "NODEWRIGHT_VALIDATOR_PORT": "tcp://10.0.0.7:443",
        "NODEWRIGHT_VALIDATOR_PORT_443_TCP": "tcp://10.0.0.7:443",
        "NODEWRIGHT_VALIDATOR_PORT_443_TCP_PROTO": "tcp",
        "NODEWRIGHT_VALIDATOR_PORT_443_TCP_PORT": "443",
        "NODEWRIGHT_VALIDATOR_PORT_443_TCP_ADDR": "10.0.0.7",
        "NODEWRIGHT_SCHEDULER_METRICS_SERVICE_HOST": "10.0.0.8",
        "NODEWRIGHT_SCHEDULER_METRICS_PORT_8080_TCP_ADDR": "10.0.0.8",
    }
    s = config.load(config.ServiceSettings, {**links, "NODEWRIGHT_HEALTH_PORT": "9000"})
    assert s.health.port == 9000
    # The settings' own names are never taken for links ...
    assert (
        config.load(config.ServiceSettings, {"NODEWRIGHT_HEALTH_PORT": "9001"}).health.port == 9001
    )
    # ... and a link-shaped name of no Service is a misspelt setting.
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_NATS_PORT"):
        config.load(config.ServiceSettings, {"NODEWRIGHT_NATS_PORT": "4222"})


def test_credentials_that_cannot_work_stop_the_service_at_once_naming_what_to_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reported before NATS is tried: with no NATS either, the service used to wait for it
    and say nothing about the kubeconfig."""

    async def build(ctx: runtime.ServiceContext) -> None:
        raise AssertionError("never built")

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # as outside a pod

    environ = {"NODEWRIGHT_NATS_URL": "nats://127.0.0.1:9", "NODEWRIGHT_HEALTH_PORT": "0"}
    code = runtime.main(
        name="tester", settings_type=config.ServiceSettings, build=build, environ=environ
    )
    assert code == 2
    assert "set NODEWRIGHT_KUBE_KUBECONFIG" in capsys.readouterr().err


async def test_services_sharing_a_process_name_their_tasks_and_stop_together() -> None:
    sup = runtime.Supervisor(name="all", graceful_timeout_s=1)
    scheduler, drainer = sup.scoped("scheduler"), sup.scoped("drainer")

    async def forever() -> None:
        await asyncio.Event().wait()

    # Both have an informer of nodes: the scope tells them apart.
    scheduler.add("informer:nodes", forever)
    drainer.add("informer:nodes", forever)
    with pytest.raises(ValueError, match="drainer/informer:nodes"):
        drainer.add("informer:nodes", forever)
    assert drainer.stopping is sup.stopping
    run = asyncio.create_task(sup.run())
    await asyncio.sleep(0.05)
    drainer.request_stop("the drainer asked")
    assert await asyncio.wait_for(run, 5) == 0
    assert scheduler.stopping.is_set()


def test_services_sharing_an_environment_each_get_their_settings_and_a_typo_is_refused() -> None:
    environ = {
        "NODEWRIGHT_NATS_URL": "nats://x:1",
        "NODEWRIGHT_WEBHOOK_PORT": "9443",  # the validator's alone
        "NODEWRIGHT_DRAINER_WORKERS": "4",  # the drainer's alone
        "HOME": "/x",
    }
    drainer, validator = config.load_many([DrainerSettings, ValidatorSettings], environ)
    assert isinstance(drainer, DrainerSettings)
    assert isinstance(validator, ValidatorSettings)
    assert drainer.nats.url == validator.nats.url == "nats://x:1"
    assert validator.webhook.port == 9443
    assert drainer.drainer.workers == 4
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_WEBHOOK_PROT"):
        config.load_many(
            [DrainerSettings, ValidatorSettings], {**environ, "NODEWRIGHT_WEBHOOK_PROT": "1"}
        )
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_WEBHOOK_PORT"):
        config.load_many([DrainerSettings, ValidatorSettings], {"NODEWRIGHT_WEBHOOK_PORT": "x"})


def test_python_m_services_names_the_unknown_service_and_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        together.main(["scheduler", "drianer"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown service 'drianer'" in err
    assert "scheduler, drainer, executor, validator, status" in err


def test_metrics_that_services_sharing_a_registry_both_make_are_made_once() -> None:
    registry = runtime.process_registry()
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    assert collectors.once(registry, "m", make) == collectors.once(registry, "m", make) == 1
    assert collectors.once(runtime.process_registry(), "m", make) == 2, "per registry"
    assert collectors.once(None, "m", make) == 3, "no registry: nothing shared"
