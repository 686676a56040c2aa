"""Build hook: the wheel also carries what the command line needs from outside its packages.

``nodewright sandbox`` (and ``nodewright.manifests``) install NodeWright's CRDs and apply its
samples, which live in deploy/ for Helm, kubectl and Argo CD; and a machine without the
rig's binaries builds them with scripts/build-rig.sh from the wrapper modules in tools/.
build_py copies those files into the wheel under ``nodewright/_data`` (the same layout,
so the script finds its tools and shares the rig cache with a checkout). A checkout uses
the files where they are (``nodewright.manifests`` looks there first), so nothing is copied
into the source tree. Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CARRIED = ("deploy/crds", "deploy/samples", "scripts/build-rig.sh", "tools")
"""Paths (relative to the repository) the wheel carries under nodewright/_data."""
TOOL_FILES = ("go.mod", "go.sum", "*.go")
"""Of tools/: only the committed module files (a local Go build leaves nothing else)."""


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        data = Path(self.build_lib) / "nodewright" / "_data"
        for rel in CARRIED:
            source = HERE / rel
            target = data / rel
            if source.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
                continue
            patterns = TOOL_FILES if rel == "tools" else ("*",)
            for pattern in patterns:
                for path in source.rglob(pattern):
                    if path.is_file():
                        dest = target / path.relative_to(source)
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(path, dest)


setup(cmdclass={"build_py": BuildPy})
