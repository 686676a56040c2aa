"""The five NodeWright services as real processes against the rig.

Used by the sandbox, the end-to-end tests and the benchmark: each service replica runs as
``python -m services.<name>`` with its environment pointing at the rig, its own health port
and a log file in the rig's directory; or all five run in one process, ``python -m services``
(:meth:`Fleet.start_together`, the replicas of service :data:`TOGETHER`). Replicas can be
killed (SIGKILL, to test crash recovery), restarted and scaled. Processes are stopped by pid,
never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from nodewright.rig import Rig, RigError, _death_signal_if_main_thread, _tail, free_port

SERVICES = ("scheduler", "drainer", "executor", "validator", "status")
TOGETHER = "all"
"""The replicas' service name for one process running all five (``python -m services``)."""
RBAC_DIR = (
    Path(__file__).resolve().parents[2] / "deploy" / "chart" / "nodewright" / "files" / "rbac"
)


@dataclass
class Replica:
    service: str
    index: int
    popen: subprocess.Popen[bytes]
    log: Path
    health_port: int

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def rss_bytes(self) -> int:
        """Resident set size now (Linux /proc), 0 if the process is gone."""
        try:
            for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0

    def peak_rss_bytes(self) -> int:
        try:
            for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return 0
        return 0


@dataclass
class Fleet:
    rig: Rig
    namespace: str = "nodewright-system"
    simulate: bool = True
    rbac: bool = False
    """Run each service as its own ServiceAccount with the RBAC of the Helm chart (least
    privilege, as in a cluster) instead of as the rig's administrator."""
    extra_env: dict[str, str] = field(default_factory=dict)
    replicas: dict[str, list[Replica]] = field(default_factory=dict)
    _next_index: dict[str, int] = field(default_factory=dict)
    _log_starts: dict[Path, int] = field(default_factory=dict)
    _kubeconfigs: dict[str, Path] = field(default_factory=dict)
    _webhook_port: int = 0

    def _kubectl(self, *args: str, stdin: str = "") -> str:
        done = subprocess.run(
            [
                str(self.rig.bin_dir / "kubectl"),
                "--kubeconfig",
                str(self.rig.endpoints.kubeconfig),
                *args,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RigError("kubectl", f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def kubeconfig_for(self, service: str) -> Path:
        """The service's own ServiceAccount kubeconfig, with the chart's RBAC (files/rbac)."""
        if service not in self._kubeconfigs:
            manifest = (RBAC_DIR / f"{service}.yaml").read_text()
            self._kubectl(
                "apply", "-f", "-", stdin=manifest.replace("nodewright-system", self.namespace)
            )
            token = self._kubectl(
                "create", "token", f"nodewright-{service}", "-n", self.namespace, "--duration=24h"
            ).strip()
            path = self.rig.dir / f"kubeconfig-{service}-{self.namespace}"
            self._kubeconfigs[service] = self.rig.write_kubeconfig(
                path, user=f"nodewright-{service}", token=token
            )
        return self._kubeconfigs[service]

    def env(self, service: str, index: int, health_port: int) -> dict[str, str]:
        env = {
            **os.environ,
            **self.rig.env(),
            "NODEWRIGHT_NAMESPACE": self.namespace,
            "NODEWRIGHT_HEALTH_HOST": "127.0.0.1",
            "NODEWRIGHT_HEALTH_PORT": str(health_port),
            "NODEWRIGHT_IDENTITY": f"{service}-{index}",
            **self.extra_env,
        }
        if self.rbac:
            if service == TOGETHER:
                raise RigError(service, "one process for all services has no RBAC of its own")
            env["NODEWRIGHT_KUBE_KUBECONFIG"] = str(self.kubeconfig_for(service))
        if self.simulate and service in ("executor", "validator", TOGETHER):
            env["NODEWRIGHT_PODS_SIMULATE"] = "true"
        if service in ("validator", TOGETHER):
            # The API server calls the webhook on loopback: there is no Service routing here.
            env.setdefault("NODEWRIGHT_WEBHOOK_HOST", "127.0.0.1")
            # One port for every replica (they share it, SO_REUSEPORT): one endpoint, as a
            # Service gives them in a cluster.
            if not self._webhook_port:
                self._webhook_port = free_port()
            env.setdefault("NODEWRIGHT_WEBHOOK_PORT", str(self._webhook_port))
            env.setdefault("NODEWRIGHT_WEBHOOK_URL", "https://127.0.0.1:{port}")
            env.setdefault("NODEWRIGHT_WEBHOOK_NAMESPACE", self.namespace)
        # Only the settings each service knows may be set: unknown NODEWRIGHT_* is an error.
        if service not in ("executor", "validator", TOGETHER):
            env = {k: v for k, v in env.items() if not k.startswith("NODEWRIGHT_PODS_")}
        if service not in ("validator", TOGETHER):
            env = {k: v for k, v in env.items() if not k.startswith("NODEWRIGHT_WEBHOOK")}
        if service not in ("drainer", TOGETHER):
            env = {k: v for k, v in env.items() if not k.startswith("NODEWRIGHT_DRAINER_")}
        return env

    def start(self, service: str, *, count: int = 1, wait: bool = True) -> list[Replica]:
        started = []
        for _ in range(count):
            index = self._next_index.get(service, 0)
            self._next_index[service] = index + 1
            port = free_port()
            log = self.rig.dir / f"{service}-{index}.log"
            # Logs are appended to across fleets of one rig: remember where this one starts.
            self._log_starts.setdefault(log, log.stat().st_size if log.exists() else 0)
            with log.open("ab") as out:
                module = "services" if service == TOGETHER else f"services.{service}"
                popen = subprocess.Popen(
                    [sys.executable, "-m", module],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=self.env(service, index, port),
                    preexec_fn=_death_signal_if_main_thread(),
                )
            replica = Replica(service=service, index=index, popen=popen, log=log, health_port=port)
            self.replicas.setdefault(service, []).append(replica)
            started.append(replica)
        if wait:
            for replica in started:
                self.wait_ready(replica)
        return started

    def start_together(self, *, wait: bool = True) -> Replica:
        """All five services in one process (``python -m services``)."""
        return self.start(TOGETHER, wait=wait)[0]

    def start_all(self, *, replicas: int = 1) -> None:
        for service in SERVICES:
            self.start(service, count=replicas, wait=False)
        for reps in self.replicas.values():
            for replica in reps:
                self.wait_ready(replica)

    def wait_ready(self, replica: Replica, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not replica.alive():
                raise RigError(
                    replica.name, f"exited with code {replica.popen.returncode}", _tail(replica.log)
                )
            if replica.ready():
                return
            time.sleep(0.1)
        raise RigError(replica.name, f"not ready after {timeout_s:.0f}s", _tail(replica.log))

    def kill(self, service: str, index: int = 0) -> Replica:
        """SIGKILL one replica (no graceful shutdown: a crash)."""
        replica = next(r for r in self.replicas[service] if r.index == index or index < 0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(replica.popen.pid, signal.SIGKILL)
        replica.popen.wait()
        self.replicas[service].remove(replica)
        return replica

    def check_alive(self) -> None:
        for reps in self.replicas.values():
            for replica in reps:
                if not replica.alive():
                    raise RigError(
                        replica.name,
                        f"exited with code {replica.popen.returncode}",
                        _tail(replica.log),
                    )

    def digest(self, lines: int = 15) -> str:
        """What every replica this fleet started logged above info level (the last
        ``lines`` of each), and its last line: for a failed test's report."""
        out: list[str] = []
        for log, start in sorted(self._log_starts.items()):
            try:
                with log.open("rb") as f:
                    f.seek(start)
                    text = f.read().decode(errors="replace").splitlines()
            except OSError:
                continue
            loud = [t for t in text if '"level":"info"' not in t and '"level":"debug"' not in t]
            out.append(f"--- {log.name}: {len(text)} lines, {len(loud)} above info ---")
            out.extend(t[:600] for t in loud[-lines:])
            if text and (not loud or text[-1] != loud[-1]):
                out.append(text[-1][:600])
        return "\n".join(out)

    def stop(self, timeout_s: float = 30.0) -> dict[str, int]:
        """SIGTERM every replica, wait, SIGKILL stragglers; return exit codes by name."""
        codes: dict[str, int] = {}
        everything = [r for reps in self.replicas.values() for r in reps]
        for replica in everything:
            if replica.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(replica.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for replica in everything:
            try:
                codes[replica.name] = replica.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(replica.popen.pid, signal.SIGKILL)
                codes[replica.name] = replica.popen.wait()
        self.replicas.clear()
        return codes
