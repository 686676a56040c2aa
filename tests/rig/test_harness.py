"""The rig fails fast and says which component broke and why."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nodewright.rig import Rig, RigError, free_port


def test_a_missing_binary_is_named_with_the_build_command(tmp_path: Path) -> None:
    rig = Rig(bin_dir=tmp_path / "empty", work_dir=tmp_path / "work")
    with pytest.raises(RigError) as err:
        rig.start()
    assert err.value.component == "etcd"
    assert "scripts/build-rig.sh" in str(err.value)


def test_a_taken_port_fails_fast_naming_the_component_with_its_log(tmp_path: Path) -> None:
    rig = Rig(work_dir=tmp_path, startup_timeout_s=20)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            with pytest.raises(RigError) as err:
                rig.start_nats(port=port)
        finally:
            rig.stop()
    assert err.value.component == "nats-server"
    assert "address already in use" in err.value.log_tail.lower()


def test_listening_ports_are_outside_the_ephemeral_range_and_never_handed_out_twice() -> None:
    # A port from the kernel's ephemeral range can be taken by any outgoing connection
    # between the pick and the service's bind (CI's scheduler exited "address in use").
    low, _high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(p < low and p < 30000 for p in ports), [p for p in ports if p >= low]


def test_a_port_something_listens_on_is_never_handed_out() -> None:
    taken = []
    try:
        for port in range(20000, 30000):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            s.listen()
            taken.append(s)
            if len(taken) == 500:
                break
        busy = {s.getsockname()[1] for s in taken}
        # 200 picks would hit one of 500 busy ports of 10,000 almost surely if unchecked.
        picked = [free_port() for _ in range(200)]
        assert not busy & set(picked)
    finally:
        for s in taken:
            s.close()
