"""The status service's web page, in a real headless Chromium, on a running rollout: its
counts change as the rollout moves, a failed node shows its reason, the live feed shows the
stream; and only a Kubernetes user who may list NodeWrights gets to see any of it.

The browser is Debian's ``chromium`` driven through its ``chromedriver`` by Selenium; no tool
downloads a browser of its own (``SE_OFFLINE``). The test writes a screenshot of the page to
``$NW_TEST_ARTIFACTS`` (default /tmp/nodewright-test-artifacts/web-page.png) and prints
where."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import Rig, nodes
from shared import api
from shared.kube import Kube
from tests.e2e.conftest import NODES, Services, read_cr
from tests.helpers.accounts import account
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(600)

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1800",
)
SIM = "sim.nodewright.nvidia.com"
CR = "web-page"
FAILING = "gpu-node-003"


def artifacts() -> Path:
    path = Path(os.environ.get("NW_TEST_ARTIFACTS") or "/tmp/nodewright-test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's) with a fresh profile, through its chromedriver."""
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a browser or driver
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM.exists(), "scripts/install-host-deps.sh installs Debian's chromium"
    assert CHROMEDRIVER.exists(), "scripts/install-host-deps.sh installs Debian's chromium-driver"
    options = Options()
    options.binary_location = str(CHROMIUM)
    with tempfile.TemporaryDirectory(prefix="nw-chromium-") as profile:
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(
            service=Service(executable_path=str(CHROMEDRIVER)), options=options
        )
        try:
            yield driver
        finally:
            driver.quit()


def _page_counts(driver: Any) -> dict[str, int]:
    """The counts the page shows for the NodeWright, as a person reads them."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        card = driver.find_element("css selector", f'article[data-nodewright="{CR}"]')
        return {
            li.get_attribute("data-count"): int(li.find_element("tag name", "b").text)
            for li in card.find_elements("css selector", "ul.counts li")
        }
    except (NoSuchElementException, StaleElementReferenceException, ValueError):
        return {}


def _failed_row(driver: Any) -> tuple[str, str] | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        row = driver.find_element("css selector", f'tr[data-node="{FAILING}"][data-state="Failed"]')
        return (
            row.find_element("css selector", "td.reason").text,
            row.find_element("css selector", "td.message").text,
        )
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def _watch(driver: Any, url: str, timeout_s: float) -> dict[str, Any]:
    """Open the page and watch it until the rollout settled: every count it showed, the
    failed node's row, the feed; a screenshot at the end."""
    driver.get(url)
    seen: list[dict[str, int]] = []
    failed: tuple[str, str] | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts = _page_counts(driver)
        if counts and (not seen or counts != seen[-1]):
            seen.append(counts)
        failed = failed or _failed_row(driver)
        if counts.get("Complete") == 7 and failed:
            break
        time.sleep(0.25)
    feed = driver.execute_script(
        "return [...document.querySelectorAll('#feed li')].map(li => li.dataset.kind)"
    )
    shot = artifacts() / "web-page.png"
    driver.save_screenshot(str(shot))
    return {
        "seen": seen,
        "failed": failed,
        "feed": feed,
        "url": driver.current_url,
        "connection": driver.find_element("id", "connection").text,
        "screenshot": shot,
    }


def _get(url: str, *, token: str = "") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def test_the_page_follows_a_rollout_and_shows_why_a_node_failed(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await nodes.create_nodes(
        kapi, [f"gpu-node-{i:03d}" for i in range(8)], labels={"nodepool": "gpu"}
    )
    await nodes.wait_ready(kapi, names)
    await kapi.patch(
        f"{NODES}/{FAILING}", {"metadata": {"annotations": {f"{SIM}/fail": "nvidia-tuned/apply"}}}
    )
    await asyncio.to_thread(services.fleet.start_all)
    example = manifests.sample("nodewright-gpu-node-tuning.yaml")
    example["metadata"]["name"] = CR
    example["spec"]["interruptionBudget"] = {"count": 2}
    port = services.fleet.replicas["status"][0].health_port
    url = f"http://127.0.0.1:{port}/ui/?token={urllib.parse.quote(rig.endpoints.token)}"
    with chromium() as driver:
        await asyncio.to_thread(driver.get, url)  # the page is open before the rollout starts
        await manifests.apply(kapi, example)
        watched = await asyncio.to_thread(_watch, driver, url, 240)
    print(f"web page screenshot: {watched['screenshot']}")
    seen = watched["seen"]
    completes = [c.get("Complete", 0) for c in seen]
    assert completes[-1] == 7, seen
    # The counts moved while the page was open: several steps between none and all.
    assert len(set(completes)) >= 3, seen
    assert completes == sorted(completes), "complete never goes backwards"
    assert any(c.get("InProgress", 0) > 0 for c in seen), seen
    assert seen[-1].get("Failed") == 1
    assert watched["failed"] is not None, "the failed node's row"
    reason, message = watched["failed"]
    assert reason == "StageFailed"
    assert "simulated failure of nvidia-tuned apply" in message
    # The token left the address bar at once: the cookie carries it.
    assert watched["url"].endswith("/ui/"), watched["url"]
    assert watched["connection"] == "live"
    assert "node.completed" in watched["feed"], watched["feed"]
    assert "stage.failed" in watched["feed"], watched["feed"]
    png = await asyncio.to_thread(Path(watched["screenshot"]).read_bytes)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 20_000
    cr = await read_cr(kapi, CR)
    assert cr.status.node_counts.complete == 7, "the page said what the status says"


async def test_only_a_user_who_may_list_nodewrights_sees_anything(
    rig: Rig, cluster: Kube, services: Services, tmp_path: Path
) -> None:
    kapi = cluster
    await asyncio.to_thread(services.fleet.start, "status")
    base = f"http://127.0.0.1:{services.fleet.replicas['status'][0].health_port}/ui"
    reader_rules = [{"apiGroups": [api.GROUP], "resources": ["nodewrights"], "verbs": ["list"]}]
    async with (
        account(
            rig, kapi, namespace=services.namespace, name="nobody", rules=[], directory=tmp_path
        ) as nobody,
        account(
            rig,
            kapi,
            namespace=services.namespace,
            name="reader",
            rules=reader_rules,
            directory=tmp_path,
        ) as reader,
    ):
        for token in ("", "garbage", nobody.token):
            code, headers, body = await asyncio.to_thread(_get, f"{base}/api/overview", token=token)
            assert code == 401, (token[:8], code, body)
            assert headers["WWW-Authenticate"] == 'Bearer realm="nodewright"'
            assert json.loads(body) == {
                "error": "a bearer token whose user may list NodeWrights is needed"
            }
        code, headers, body = await asyncio.to_thread(
            _get, f"{base}/api/overview", token=reader.token
        )
        assert code == 200, body
        assert json.loads(body) == {"nodewrights": [], "invalid": []}
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        assert headers["Referrer-Policy"] == "no-referrer"
        # Without a token the page is a sign-in form, and a refused token says so.
        code, _, body = await asyncio.to_thread(_get, f"{base}/")
        assert code == 200
        assert b'id="login"' in body
        assert b"data-nodewright" not in body
        code, _, body = await asyncio.to_thread(_get, f"{base}/?token={nobody.token}")
        assert code == 401
        assert b'id="login-error"' in body
        # Signing in in the browser sets the cookie and shows the page.
        with chromium() as driver:
            await asyncio.to_thread(driver.get, f"{base}/")
            field = await asyncio.to_thread(driver.find_element, "id", "token")
            await asyncio.to_thread(field.send_keys, reader.token)
            await asyncio.to_thread(field.submit)

            async def signed_in() -> bool:
                return bool(
                    await asyncio.to_thread(
                        driver.execute_script, "return !!document.getElementById('nodewrights')"
                    )
                )

            await eventually(signed_in, what="the page after signing in")
            (cookie,) = await asyncio.to_thread(driver.get_cookies)
            assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == (
                "nodewright_ui_token",
                True,
                "Strict",
            )
            user = await asyncio.to_thread(driver.find_element, "css selector", ".user")
            assert user.text == reader.user
