"""A real browser for the tests: Debian's headless Chromium driven through its own
chromedriver (``make browser`` installs both), never a driver or browser fetched at
run time. Also an aiohttp app served on a free loopback port for it to open, what the
page logged to its console, and screenshots kept for a reader of a failed run.

``MATERIALIZER_CHROMIUM`` and ``MATERIALIZER_CHROMEDRIVER`` point at another matching
pair; ``MATERIALIZER_TEST_ARTIFACTS`` names the folder the screenshots go to.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiohttp import web
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from query_service.http.server import start_http

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("MATERIALIZER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MATERIALIZER_CHROMEDRIVER", "/usr/bin/chromedriver")
WINDOW = (1400, 1000)
"""A fixed window, so layouts and screenshots compare from run to run."""

_SAFE_NAME = re.compile(r"[^\w.-]+")


def artifacts() -> Path:
    """The folder screenshots are saved to (created on first use)."""
    folder = Path(os.environ.get("MATERIALIZER_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def chromium_options() -> webdriver.ChromeOptions:
    """Headless Chromium at ``WINDOW``, its console kept for ``console_errors``, and no
    host name resolved but localhost: chromedriver already turns off background traffic,
    but Debian's chromium still looks up its extension update server."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # as root and in containers, where the sandbox cannot start
        "--disable-dev-shm-usage",  # a container's /dev/shm is too small for its pages
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return options


@contextmanager
def headless_chromium() -> Iterator[webdriver.Chrome]:
    """A Chromium session, quit (browser and driver processes with it) on the way out.

    The driver and the browser are named explicitly, so Selenium Manager never runs and
    nothing is downloaded. Raises ``FileNotFoundError`` naming what to install when
    either is missing."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).is_file()]
    if missing:
        raise FileNotFoundError(
            f"no {' or '.join(missing)}: run `make browser` (Debian's chromium and "
            "chromium-driver), or set MATERIALIZER_CHROMIUM and MATERIALIZER_CHROMEDRIVER"
        )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=chromium_options())
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: webdriver.Chrome) -> list[str]:
    """The messages of the SEVERE entries the page logged to the console (uncaught
    exceptions, ``console.error``, resources that failed to load) since the last call:
    reading the log empties it."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def save_screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """The window as ``<name>.png`` in ``artifacts()``; the file written."""
    path = artifacts() / f"{_SAFE_NAME.sub('-', name)}.png"
    if not driver.save_screenshot(str(path)):
        raise OSError(f"the browser could not write its screenshot to {path}")
    return path


@contextmanager
def served(app: web.Application) -> Iterator[str]:
    """``app`` on a free loopback port, run by an event loop on a thread of its own so a
    synchronous test can drive the browser meanwhile; its base URL (``http://host:port``)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        started = asyncio.run_coroutine_threadsafe(start_http(app, "127.0.0.1", 0, None), loop)
        runner, port = started.result(30)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
