"""The bus's least privilege as data (shared.grants), the users' files `nodewright nats-users`
writes, and the credentials a service connects with (shared.bus.credentials)."""

from __future__ import annotations

import ssl
from pathlib import Path

import bcrypt
import pytest
import yaml

from nodewright import natsusers
from nodewright.rig import pki
from shared import bus, config, events, grants, subjects


def test_every_event_kind_has_exactly_one_publisher() -> None:
    published = [kind for kinds in grants.PUBLISHES.values() for kind in kinds]
    assert sorted(published) == sorted(set(published)), "no kind is published by two services"
    assert set(published) == set(events.KINDS)
    assert set(grants.PUBLISHES) == set(grants.CONSUMERS) == set(grants.SERVICES)


def test_a_service_may_publish_its_own_kinds_and_dead_letters_only() -> None:
    allow = grants.service_permissions("drainer", stream="NODEWRIGHT")["publish"]["allow"]
    assert subjects.kind_filter("node.drained") in allow
    assert subjects.kind_filter("stage.succeeded") not in allow
    assert subjects.dead_letter("drainer") in allow
    assert subjects.dead_letter("executor") not in allow
    assert "$JS.ACK.NODEWRIGHT.drainer.>" in allow
    assert not [a for a in allow if a.startswith("$JS.ACK.") and ".drainer." not in a]
    assert not [a for a in allow if "DELETE" in a], "no service deletes the stream or a consumer"


def test_the_reader_creates_only_unnamed_consumers_and_publishes_nothing() -> None:
    perms = grants.reader_permissions(stream="NODEWRIGHT")
    assert "$JS.API.CONSUMER.CREATE.NODEWRIGHT" in perms["publish"]["allow"]
    assert not [
        a for a in perms["publish"]["allow"] if a.startswith("$JS.API.CONSUMER.CREATE.NODEWRIGHT.")
    ]
    assert perms["publish"]["deny"] == [subjects.ALL, "$JS.ACK.>"]


def test_the_one_process_user_may_do_what_the_five_services_may_and_no_more() -> None:
    perms = grants.one_process_permissions(stream="NODEWRIGHT")
    allow = perms["publish"]["allow"]
    each = [
        set(grants.service_permissions(s, stream="NODEWRIGHT")["publish"]["allow"])
        for s in grants.SERVICES
    ]
    assert set(allow) == set().union(*each)
    assert len(allow) == len(set(allow)), "each subject once"
    assert perms["subscribe"] == {"allow": ["_INBOX.>"]}
    assert not [a for a in allow if "DELETE" in a]
    assert "$JS.ACK.NODEWRIGHT.status-dead-letters.>" in allow
    (user,) = grants.authorization({grants.ONE_PROCESS: "x"})["users"]
    assert user["user"] == "nodewright-services"
    assert user["permissions"] == perms


def test_authorization_refuses_an_unknown_user() -> None:
    with pytest.raises(ValueError, match="unknown NATS user 'sheduler'"):
        grants.authorization({"sheduler": "x"})


def test_nats_users_writes_hashes_for_nats_and_passwords_for_nodewright(tmp_path: Path) -> None:
    values, secrets_file = natsusers.write(tmp_path, secret="nw-nats", namespace="ns")
    users = yaml.safe_load(values.read_text())["config"]["merge"]["authorization"]["users"]
    assert sorted(u["user"] for u in users) == sorted(
        grants.user(w) for w in (*grants.SERVICES, grants.ONE_PROCESS, grants.READER)
    )
    service_secret, reader_secret = [d for d in yaml.safe_load_all(secrets_file.read_text()) if d]
    assert service_secret["metadata"] == {
        "name": "nw-nats",
        "namespace": "ns",
        "labels": service_secret["metadata"]["labels"],
    }
    assert sorted(service_secret["stringData"]) == sorted((*grants.SERVICES, grants.ONE_PROCESS))
    by_user = {u["user"]: u["password"] for u in users}
    for service, password in service_secret["stringData"].items():
        assert bcrypt.checkpw(password.encode(), by_user[grants.user(service)].encode())
        assert password not in values.read_text(), "no password reaches the NATS values"
    assert reader_secret["stringData"]["user"] == "nodewright-reader"
    assert secrets_file.stat().st_mode & 0o077 == 0


def test_credentials_come_from_the_settings_and_the_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    certs = pki.write(tmp_path / "pki")
    settings = config.NatsSettings(
        user="nodewright-executor",
        password_file=str(secret),
        tls_ca_file=str(certs.ca_cert),
        tls_cert_file=str(certs.kubelet_client_cert),
        tls_key_file=str(certs.kubelet_client_key),
    )
    options = bus.credentials(settings)
    assert options["user"] == "nodewright-executor"
    assert options["password"] == "s3cret"
    assert isinstance(options["tls"], ssl.SSLContext)
    assert bus.credentials(config.NatsSettings()) == {}
