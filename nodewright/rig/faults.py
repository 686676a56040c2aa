"""A fault proxy on loopback between the services and the rig's API server and NATS.

Toxiproxy (built by scripts/build-rig.sh from the Go module proxy) forwards TCP from a
loopback port to the real one; through its HTTP API a test adds latency to every request,
or cuts the link (every open connection is closed and new ones are refused) and restores it.
TLS passes through untouched: the API server's certificate names 127.0.0.1, which is where
the proxy listens too.

Only the services go through the proxy (a kubeconfig and a NATS URL of their own); the test's
own clients, its ledgers and samplers talk to the rig directly, so what they observe is never
delayed by the faults they measure.

Not this module's job: deciding when to inject what (the fault runs, bench/faults.py), or
starting the rig (nodewright.rig).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodewright.rig import Process, Rig, RigError, free_port

BINARY = "toxiproxy-server"


@dataclass
class Link:
    """One proxied connection: ``listen`` on loopback forwards to ``upstream``."""

    name: str
    listen: str
    upstream: str


@dataclass
class FaultProxy:
    """A toxiproxy server started beside a rig, and the links through it."""

    rig: Rig
    process: Process | None = None
    api_port: int = 0
    links: dict[str, Link] = field(default_factory=dict)

    def start(self) -> FaultProxy:
        binary = self.rig.bin_dir / BINARY
        if not binary.is_file():
            raise RigError(
                "toxiproxy", f"{binary} is missing; run `make rig` (scripts/build-rig.sh toxiproxy)"
            )
        self.api_port = free_port()
        self.process = self.rig.run_component(
            "toxiproxy",
            [str(binary), "-host", "127.0.0.1", "-port", str(self.api_port)],
            lambda: self._get("/version") is not None,
            "serving its API",
        )
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.rig.processes.pop("toxiproxy", None)
            self.process = None

    # ---- links --------------------------------------------------------------------------

    def link(self, name: str, upstream: str) -> Link:
        """Forward a new loopback port to ``upstream`` ("host:port")."""
        listen = f"127.0.0.1:{free_port()}"
        self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )
        self.links[name] = Link(name=name, listen=listen, upstream=upstream)
        return self.links[name]

    def api_link(self) -> Link:
        """A link to the rig's API server."""
        return self.link("kube-apiserver", self.rig.endpoints.api_url.removeprefix("https://"))

    def nats_link(self) -> Link:
        """A link to the rig's nats-server (the same port after a restart)."""
        return self.link("nats", self.rig.endpoints.nats_url.removeprefix("nats://"))

    def kubeconfig_through(self, link: Link, path: Path) -> Path:
        """A copy of the rig's admin kubeconfig whose server is ``link``."""
        return self.rig.write_kubeconfig(
            path,
            user="nodewright-admin",
            token=self.rig.endpoints.token,
            server=f"https://{link.listen}",
        )

    # ---- faults -------------------------------------------------------------------------

    def add_latency(self, name: str, ms: int) -> None:
        """Delay every request through ``name`` by ``ms`` (data from the client to the
        server: each API call and each publish waits that long before it reaches the server)."""
        self._call(
            "POST",
            f"/proxies/{name}/toxics",
            {
                "name": "latency",
                "type": "latency",
                "stream": "upstream",
                "toxicity": 1.0,
                "attributes": {"latency": ms, "jitter": 0},
            },
        )

    def remove_latency(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{name}/toxics/latency")

    def cut(self, name: str) -> None:
        """A partition: close every connection through ``name`` and refuse new ones."""
        self._call("POST", f"/proxies/{name}", {"enabled": False})

    def restore(self, name: str) -> None:
        self._call("POST", f"/proxies/{name}", {"enabled": True})

    # ---- the HTTP API -------------------------------------------------------------------

    def _get(self, path: str) -> Any:
        try:
            return self._call("GET", path)
        except (OSError, RigError):
            return None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}", data=data, method=method
        )
        req.add_header("Content-Type", "application/json")
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    text = resp.read().decode()
                return json.loads(text) if text.strip() else None
            except urllib.error.HTTPError as exc:
                raise RigError(
                    "toxiproxy", f"{method} {path} answered {exc.code}: {exc.read().decode()}"
                ) from exc
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
