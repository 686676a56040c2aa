"""NodeWright as a user installs it, not as a checkout runs it: the wheel carries the CRDs,
samples and the rig's build script (a pip-installed ``nodewright sandbox`` runs from any
directory), its commands include the kubectl plugin, and krew installs the plugin from the
committed manifest and the archive scripts/build-krew-archive.sh builds (reproducibly: the
manifest's sha256 is the archive's)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from nodewright.rig import default_bin_dir
from tests.helpers.cli import Result

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]


async def run(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout_s: float = 600
) -> Result:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), "")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from this checkout (once for the module)."""
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = out.glob("nodewright-*.whl")
    return found


async def test_the_wheel_carries_what_the_command_line_needs(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for crd in (REPO / "deploy" / "crds").glob("*.yaml"):
        assert f"nodewright/_data/deploy/crds/{crd.name}" in names
    for sample in (REPO / "deploy" / "samples").glob("*.yaml"):
        assert f"nodewright/_data/deploy/samples/{sample.name}" in names
    assert "nodewright/_data/scripts/build-rig.sh" in names
    assert "nodewright/_data/tools/k8s/go.sum" in names
    assert "nodewright/rig/kwok.yaml" in names
    for ui in ("index.html", "login.html", "app.js", "style.css"):
        assert f"services/status/ui/{ui}" in names
    (license_file,) = [
        n for n in names if n.endswith((".dist-info/licenses/LICENSE", ".dist-info/LICENSE"))
    ]
    text = zipfile.ZipFile(wheel).read(license_file).decode()
    assert "Apache License" in text
    assert "END OF TERMS AND CONDITIONS" in text
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    for line in (
        "nodewright = nodewright.cli:main",
        "kubectl-nodewright = nodewright.cli:main",
        "kubectl_complete-nodewright = nodewright.cli:kubectl_complete",
    ):
        assert line in scripts


async def test_a_pip_installed_nodewright_runs_the_sandbox_from_any_directory(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    assert (await run(sys.executable, "-m", "venv", str(venv))).code == 0
    installed = await run(
        str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[sandbox]"
    )
    assert installed.code == 0, installed.out
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The packaged build script knows the rig's cache: the binaries are found, not rebuilt.
    script = next(
        (venv / "lib").glob("python3*/site-packages/nodewright/_data/scripts/build-rig.sh")
    )
    cached = await run("bash", str(script), "etcd", "kwok", cwd=elsewhere)
    assert cached.code == 0, cached.out
    assert "etcd: cached" in cached.out
    assert "kwok: cached" in cached.out
    assert cached.out.strip().splitlines()[-1] == str(default_bin_dir())
    sandbox = await run(
        str(venv / "bin" / "nodewright"),
        "sandbox",
        "--gpu-nodes",
        "2",
        "--cpu-nodes",
        "1",
        "--stage-duration",
        "1s",
        "--exit-when-ready",
        "--timeout",
        "240",
        cwd=elsewhere,
        env={"PYTHONPATH": ""},
    )
    assert sandbox.code == 0, sandbox.out
    assert "NodeWright gpu-node-tuning is Ready" in sandbox.out
    plugin = await run(str(venv / "bin" / "kubectl-nodewright"), "version", "--client")
    assert plugin.out.strip() == "Client version: 0.1.0"


async def test_krew_installs_the_plugin_from_the_manifest_and_the_reproducible_archive(
    wheel: Path, tmp_path: Path
) -> None:
    krew = default_bin_dir() / "krew"
    assert krew.exists(), "scripts/build-rig.sh krew builds it"
    built = await run(str(REPO / "scripts" / "build-krew-archive.sh"), str(tmp_path / "dist"))
    assert built.code == 0, built.out
    sha, archive = built.out.strip().splitlines()[-1].split()
    manifest = REPO / "deploy" / "krew" / "nodewright.yaml"
    platforms = yaml.safe_load(manifest.read_text())["spec"]["platforms"]
    assert {p["sha256"] for p in platforms} == {sha}, "rebuild the archive and update the manifest"
    assert all(p["uri"].endswith(Path(archive).name) for p in platforms)
    root = tmp_path / "krew"
    env = {"KREW_ROOT": str(root), "HOME": str(tmp_path)}
    done = await run(
        str(krew), "install", f"--manifest={manifest}", f"--archive={archive}", env=env
    )
    assert done.code == 0, done.out
    assert re.search(r"Installed plugin: nodewright", done.out), done.out
    kubectl = default_bin_dir() / "kubectl"
    path = f"{root / 'bin'}:{os.environ['PATH']}"
    first = await run(
        str(kubectl),
        "nodewright",
        "version",
        "--client",
        env={**env, "PATH": path, "NODEWRIGHT_KREW_REQUIREMENT": str(wheel)},
    )
    assert first.code == 0, first.out
    assert first.out.strip().splitlines()[-1] == "Client version: 0.1.0"
    assert "installing" in first.out, "the first run installs the package"
    again = await run(
        str(kubectl),
        "nodewright",
        "version",
        "--client",
        env={**env, "PATH": path, "NODEWRIGHT_KREW_REQUIREMENT": str(wheel)},
    )
    assert again.out.strip() == "Client version: 0.1.0", "later runs only exec it"
