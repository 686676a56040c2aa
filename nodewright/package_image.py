"""Check a *built* package image, not only its source directory.

``nodewright package validate`` takes a directory or an image archive (``oci-archive:FILE``,
``docker-archive:FILE``, or a bare ``FILE.tar`` holding either format, as ``buildah push``,
``podman save`` and ``skopeo copy`` write them). For an archive, :func:`unpack` lays the
image's filesystem out in a temporary directory exactly as a container runtime would (layers
applied in order, whiteouts honoured, no file written outside the directory), and the
result is checked with the agent's own rules (``agent.validate``) as the directory the agent
will see at ``/nodewright-package``. That is where a package built the way 0.1 documented it
(files under ``/nodewright-package/`` inside the image) shows its mistake before it ships.

Standard library only. Pulling from a registry is not this module's job (``skopeo copy
docker://REF oci-archive:FILE`` first).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import posixpath
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from agent.validate import validate_package_dir

ARCHIVE_PREFIXES = ("oci-archive:", "docker-archive:")
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"


class ImageError(Exception):
    """The archive cannot be read as an image; the message says what it is instead."""


def is_archive_ref(target: str) -> bool:
    """Whether ``validate`` should treat ``target`` as an image archive."""
    if target.startswith(ARCHIVE_PREFIXES):
        return True
    path = Path(target)
    return path.is_file() and tarfile.is_tarfile(path)


def archive_path(target: str) -> Path:
    for prefix in ARCHIVE_PREFIXES:
        if target.startswith(prefix):
            # transport:path[:reference], as containers-transports(5) spells it.
            return Path(target[len(prefix) :].split(":", 1)[0])
    return Path(target)


def _json(tar: tarfile.TarFile, name: str) -> Any:
    member = tar.extractfile(name.lstrip("./"))
    if member is None:
        raise ImageError(f"{name} is not a file in the archive")
    return json.load(member)


def _blob(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def _layers(tar: tarfile.TarFile) -> list[str]:
    """Archive member names of the image's layers, base first."""
    names = set(tar.getnames())
    if "index.json" in names:  # OCI image layout
        index = _json(tar, "index.json")
        manifests = index.get("manifests") or []
        if not manifests:
            raise ImageError("index.json lists no image")
        manifest = _json(tar, _blob(manifests[0]["digest"]))
        if "manifests" in manifest:  # an index of platforms: take the first
            manifest = _json(tar, _blob(manifest["manifests"][0]["digest"]))
        return [_blob(layer["digest"]) for layer in manifest.get("layers", [])]
    if "manifest.json" in names:  # docker-archive (docker save)
        manifest = _json(tar, "manifest.json")
        if not manifest:
            raise ImageError("manifest.json lists no image")
        return [str(layer) for layer in manifest[0].get("Layers", [])]
    raise ImageError("neither an OCI archive (index.json) nor a docker archive (manifest.json)")


def _layer_tar(stream: IO[bytes]) -> tarfile.TarFile:
    data = stream.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif data[:4] == b"\x28\xb5\x2f\xfd":
        raise ImageError("a layer is zstd-compressed; re-export with gzip or uncompressed layers")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:")


def _safe(name: str) -> str | None:
    """``name`` as a relative path inside the image, or None when it escapes it."""
    norm = posixpath.normpath("/" + name).lstrip("/")
    return None if norm in ("", ".") or norm.startswith("..") else norm


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        for child in path.iterdir():
            _remove(child)
        path.rmdir()


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path``'s parent, symlinks resolved, is still under ``root``: a layer's
    symlink (``etc -> /etc``) must never let a later entry write outside the directory."""
    return path.parent.resolve().is_relative_to(root.resolve())


def _apply(layer: tarfile.TarFile, dest: Path) -> None:
    for member in layer:
        rel = _safe(member.name)
        if rel is None or not _inside(dest / rel, dest):
            continue
        parent, base = posixpath.split(rel)
        if base == _OPAQUE:
            directory = dest / parent
            if directory.is_dir():
                for child in directory.iterdir():
                    _remove(child)
            continue
        if base.startswith(_WHITEOUT):
            _remove(dest / parent / base[len(_WHITEOUT) :])
            continue
        target = dest / rel
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            target.unlink()
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
        elif member.issym():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(member.linkname)
        elif member.isfile():
            target.parent.mkdir(parents=True, exist_ok=True)
            source = layer.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
            target.chmod(member.mode & 0o777)
        # Hard links, devices and FIFOs cannot be package files the agent reads; skipped.


def unpack(archive: Path, dest: Path) -> None:
    """Lay the image in ``archive`` out under ``dest`` (an empty directory)."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for name in _layers(tar):
                stream = tar.extractfile(name.lstrip("./"))
                if stream is None:
                    raise ImageError(f"layer {name} is missing from the archive")
                with _layer_tar(stream) as layer:
                    _apply(layer, dest)
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise ImageError(f"cannot read {archive}: {exc}") from None


def files(root: Path) -> Iterator[str]:
    """Every path under ``root``, relative, sorted (for messages and tests)."""
    for path in sorted(root.rglob("*")):
        yield str(path.relative_to(root))


def validate(target: str) -> list[str]:
    """Every problem of the package at ``target`` (a directory or an image archive), each
    naming its file; for an archive, as ``ARCHIVE:/path/in/the/image``."""
    if not is_archive_ref(target):
        return validate_package_dir(target)
    archive = archive_path(target)
    with tempfile.TemporaryDirectory(prefix="nodewright-image-") as tmp:
        root = Path(tmp)
        try:
            unpack(archive, root)
        except ImageError as exc:
            return [f"{archive}: {exc}"]
        return [p.replace(str(root), f"{archive}:", 1) for p in validate_package_dir(root)]


# ---- building a package image without a daemon --------------------------------------------

_LAYER = "application/vnd.oci.image.layer.v1.tar"
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
PACKAGE_ENTRIES = ("config.json", "steps", "root")
"""What a package image holds at its root (docs/packages.md, "Package image")."""


def _layer_from(package_dir: Path) -> bytes:
    """A reproducible tar of the package's entries, at the image root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in PACKAGE_ENTRIES:
            top = package_dir / entry
            if not (top.exists() or top.is_symlink()):
                continue
            paths = [top, *sorted(top.rglob("*"))] if top.is_dir() else [top]
            for path in paths:
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(package_dir)))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isfile():
                    with path.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def _add_blob(tar: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(_blob(digest))
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return digest, len(data)


def build_archive(package_dir: Path, *, ref: str, out: Path) -> str:
    """Write a ``FROM scratch`` package image of ``package_dir`` as an OCI archive at ``out``
    (one layer: config.json, steps/, root/ at the image root), named ``ref``; return the
    manifest digest. The same as ``buildah bud`` of the documented Containerfile, without a
    builder: ``skopeo copy oci-archive:OUT docker://REF`` publishes it."""
    layer = _layer_from(package_dir)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        },
        sort_keys=True,
    ).encode()
    with tarfile.open(out, mode="w") as tar:
        _add_blob(tar, layer)
        config_digest, config_size = _add_blob(tar, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": _MANIFEST,
                "config": {"mediaType": _CONFIG, "digest": config_digest, "size": config_size},
                "layers": [{"mediaType": _LAYER, "digest": layer_digest, "size": len(layer)}],
            },
            sort_keys=True,
        ).encode()
        manifest_digest, manifest_size = _add_blob(tar, manifest)
        for name, doc in (
            ("oci-layout", {"imageLayoutVersion": "1.0.0"}),
            (
                "index.json",
                {
                    "schemaVersion": 2,
                    "manifests": [
                        {
                            "mediaType": _MANIFEST,
                            "digest": manifest_digest,
                            "size": manifest_size,
                            "annotations": {"org.opencontainers.image.ref.name": ref},
                        }
                    ],
                },
            ),
        ):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return manifest_digest
