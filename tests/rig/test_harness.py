"""The rig fails fast and says which component broke and why."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nodewright.rig import Rig, RigError


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
