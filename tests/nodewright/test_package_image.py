"""Package images as archives: built without a daemon, unpacked as a runtime would, checked
with the agent's rules, and the 0.1 layout (files under /nodewright-package/) named."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from nodewright import package_image
from nodewright.rig import realnode

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "packages" / "sysctl-tuning"


def _tar(entries: list[tuple[str, bytes | None, str]]) -> bytes:
    """A layer: (name, content or None for a directory, symlink target or "")."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, link in entries:
            info = tarfile.TarInfo(name)
            if link:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _docker_archive(path: Path, layers: list[bytes]) -> Path:
    with tarfile.open(path, mode="w") as tar:
        names = []
        for i, layer in enumerate(layers):
            info = tarfile.TarInfo(f"layer{i}.tar")
            info.size = len(layer)
            tar.addfile(info, io.BytesIO(layer))
            names.append(f"layer{i}.tar")
        manifest = json.dumps([{"Config": "c.json", "RepoTags": ["x:1"], "Layers": names}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    return path


CONFIG = json.dumps(
    {
        "schema_version": "v1",
        "name": "demo",
        "version": "1.0.0",
        "stages": {
            "apply": {
                "steps": [{"name": "a", "path": "a.sh"}],
                "check": [{"name": "c", "path": "a.sh"}],
            }
        },
    }
).encode()
STEP = b"#!/bin/sh\nexit 0\n"


def test_a_built_archive_holds_the_package_at_its_root_and_is_valid(tmp_path: Path) -> None:
    out = tmp_path / "img.tar"
    digest = package_image.build_archive(EXAMPLE, ref="example.com/sysctl-tuning:1.0.0", out=out)
    assert digest.startswith("sha256:")
    assert package_image.validate(f"oci-archive:{out}") == []
    unpacked = tmp_path / "root"
    unpacked.mkdir()
    package_image.unpack(out, unpacked)
    assert "config.json" in set(package_image.files(unpacked))
    assert os.access(unpacked / "steps" / "apply.sh", os.X_OK)
    # Reproducible: the same package gives the same image.
    assert package_image.build_archive(EXAMPLE, ref="x:1", out=tmp_path / "again.tar") == digest


def test_the_01_layout_is_named_with_the_fix(tmp_path: Path) -> None:
    layer = _tar(
        [
            ("nodewright-package", None, ""),
            ("nodewright-package/config.json", CONFIG, ""),
            ("nodewright-package/steps/a.sh", STEP, ""),
        ]
    )
    archive = _docker_archive(tmp_path / "old.tar", [layer])
    (problem,) = package_image.validate(f"docker-archive:{archive}")
    assert problem.startswith(f"{archive}:/config.json: file not found")
    assert "under /nodewright-package/" in problem
    assert "COPY config.json /config.json" in problem


def test_layers_apply_in_order_with_whiteouts(tmp_path: Path) -> None:
    base = _tar(
        [("config.json", CONFIG, ""), ("steps/a.sh", STEP, ""), ("steps/gone.sh", STEP, "")]
    )
    top = _tar([("steps/.wh.gone.sh", b"", ""), ("root/etc/x.conf", b"x=1\n", "")])
    archive = _docker_archive(tmp_path / "two.tar", [base, top])
    dest = tmp_path / "out"
    dest.mkdir()
    package_image.unpack(archive, dest)
    assert list(package_image.files(dest)) == [
        "config.json",
        "root",
        "root/etc",
        "root/etc/x.conf",
        "steps",
        "steps/a.sh",
    ]
    assert package_image.validate(str(archive)) == []


def test_no_entry_writes_outside_the_directory(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    layer = _tar(
        [
            ("../escape.txt", b"no", ""),
            ("link", None, str(outside)),
            ("link/through.txt", b"no", ""),
            ("config.json", CONFIG, ""),
        ]
    )
    archive = _docker_archive(tmp_path / "evil.tar", [layer])
    dest = tmp_path / "dest"
    dest.mkdir()
    package_image.unpack(archive, dest)
    assert not (tmp_path / "escape.txt").exists()
    assert list(outside.iterdir()) == []


def test_what_is_not_an_image_says_so(tmp_path: Path) -> None:
    path = tmp_path / "plain.tar"
    with tarfile.open(path, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        tar.addfile(info, io.BytesIO(b""))
    (problem,) = package_image.validate(f"oci-archive:{path}")
    assert "neither an OCI archive" in problem


def test_the_example_image_built_by_make_images_is_valid() -> None:
    """The image `make images` built from the example's Containerfile (with buildah), as a
    user would build it, has the layout the agent reads."""
    index = realnode.image_index(realnode.default_image_cache())
    if "sysctl-tuning" not in index:
        pytest.fail("the example image is not built: run `make images` (scripts/build-images.sh)")
    assert package_image.validate(f"oci-archive:{index['sysctl-tuning'].archive}") == []
