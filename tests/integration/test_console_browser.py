"""The web console in a real browser (headless Chromium) against a live pipeline: a real
``materializer run`` folding two maps while events keep arriving, and ``query-service
serve`` serving the pages, both as the processes users start.

Logged in with a token, the overview lists both maps folding; a map's page draws its
charts from the run's own history (read from the charts' data and the canvas pixels,
not the DOM skeleton); the entity browser finds a key produced during the test with
its watermark, and shows a ``<script>`` in it as text; the live changes show a new
change; pause and resume from the page change the state ``materializer status`` reports;
a read-only token sees no actions and is refused one it posts anyway; the page logs no
error. Screenshots of each page are saved as artifacts.
"""

from __future__ import annotations

import socket
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from typer.testing import CliRunner

from materializer.cli import app
from materializer.testing import free_port, produce
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until
from tests.helpers.browser import console_errors, save_screenshot
from tests.helpers.slices import slice_config

ADMIN = "browser-admin-token-0123456789"
READER = "browser-reader-token-0123456789"
HOSTILE = "<script>window.hostile = 1</script>"
WAIT_S = 240.0
"""How long a page may take to show what the run produces: the run starts a JVM first."""


def _event(key: str, i: int, name: str | None = None) -> tuple[bytes, bytes]:
    body = {"id": key, "name": name or f"v{i}", "age": i % 90}
    return key.encode(), orjson.dumps(body)


class Feed:
    """Events into both topics, a few per second, until stopped: the maps stay live."""

    def __init__(self, kafka: str, topics: list[str]) -> None:
        self._kafka, self._topics = kafka, topics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            for topic in self._topics:
                produce(self._kafka, topic, [_event(f"k{i % 40}", i) for i in range(i, i + 20)])
            i += 20
            self._stop.wait(0.5)

    def __enter__(self) -> Feed:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


def _wait(driver: webdriver.Chrome, what: str, condition: Callable[[], Any]) -> Any:
    """Until ``condition()`` is truthy (reloading is the condition's business)."""
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.5).until(
        lambda _: condition(), message=what
    )


def _status(config_file: Path, name: str) -> str:
    result = CliRunner().invoke(app, ["status", name, "--json", "-c", str(config_file)])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("{"))
    return str(orjson.loads(line)["state"])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _number(text: str) -> float:
    text = text.strip()
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}
    if text and text[-1] in scale:
        return float(text[:-1]) * scale[text[-1]]
    try:
        return float(text)
    except ValueError:
        return 0.0


@pytest.mark.timeout(900)
def test_the_console_in_a_browser_against_a_live_run(
    browser: webdriver.Chrome, kafka_bootstrap: str, redis_url: str, new_topic: Any,
    tmp_path: Path,
) -> None:  # fmt: skip
    suffix = uuid.uuid4().hex[:6]
    names = [f"orders{suffix}", f"users{suffix}"]
    topics = [new_topic(2), new_topic(2)]
    doc = slice_config(tmp_path, kafka_bootstrap, redis_url, topics[0], map_name=names[0])
    second = slice_config(tmp_path, kafka_bootstrap, redis_url, topics[1], map_name=names[1])
    doc["maps"].update(second["maps"])
    doc["metrics"]["history"] = {"interval": "1 second"}
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        {"name": "operator", "token": ADMIN, "maps": ["*"], "verbs": ["*"]},
        {"name": "viewer", "token": READER, "maps": ["*"],
         "verbs": ["get", "query", "watch", "status"]},
    ]}))  # fmt: skip
    http_port = free_port()
    doc["query"] = {"auth": {"tokens_file": str(tokens)}, "http_port": http_port}
    config_file = tmp_path / "maps.yaml"
    config_file.write_text(yaml.safe_dump(doc))
    for topic in topics:
        produce(kafka_bootstrap, topic, [_event(f"k{i}", i) for i in range(40)])

    run = ManagedProcess(
        [sys.executable, "-m", "materializer", "run", "-c", str(config_file)], tmp_path / "run.log"
    )
    query = ManagedProcess(
        [sys.executable, "-c", "from query_service.cli import app; app()", "serve",
         "-c", str(config_file), "--port", "0", "--metrics-port", "0"],
        tmp_path / "query.log",
    )  # fmt: skip
    base = f"http://127.0.0.1:{http_port}/ui"
    try:
        wait_until("the query service's HTTP port", lambda: _listening(http_port), timeout=60)
        with Feed(kafka_bootstrap, topics):
            _walk(browser, base, names, topics, kafka_bootstrap, config_file)
    except Exception:
        print(run.log()[-5000:], file=sys.stderr)
        print(query.log()[-3000:], file=sys.stderr)
        raise
    finally:
        query.stop()
        run.stop()


def _walk(
    driver: webdriver.Chrome,
    base: str,
    names: list[str],
    topics: list[str],
    kafka: str,
    config_file: Path,
) -> None:
    first = names[0]

    # Log in: any page sends the browser to the form first.
    def login(token: str) -> None:
        driver.get(f"{base}/")
        _wait(driver, "the login form", lambda: driver.find_elements(By.ID, "token"))
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.CSS_SELECTOR, ".login button[type=submit]").click()
        _wait(driver, "the overview", lambda: driver.find_elements(By.ID, "maps-table"))

    def loaded(url: str) -> None:
        driver.get(url)

    login(ADMIN)
    save_screenshot(driver, "console-login-done")

    # The overview: both maps, folding, with non-zero rates.
    def both_folding() -> bool:
        loaded(f"{base}/")
        rows = driver.find_elements(By.CSS_SELECTOR, "#maps-table tr[data-map]")
        rates = {
            r.get_attribute("data-map"): _number(r.find_element(By.CSS_SELECTOR, ".fold-rate").text)
            for r in rows
        }
        return all(rates.get(n, 0) > 0 for n in names)

    _wait(driver, "both maps folding on the overview", both_folding)
    save_screenshot(driver, "console-overview")

    # A map's page draws its charts with data points from the run's history.
    loaded(f"{base}/maps/{first}")

    def charted() -> bool:
        points = driver.execute_script(
            "var c = window.materializerCharts && window.materializerCharts.rates;"
            "if (!c) return 0; var fold = c.data[2] || [];"
            "return fold.filter(function (v) { return v > 0; }).length;"
        )
        if int(points or 0) < 2:
            loaded(f"{base}/maps/{first}")
            return False
        return True

    _wait(driver, "the rates chart with points", charted)
    painted = driver.execute_script(
        "var canvas = document.querySelector('figure[data-chart=rates] canvas');"
        "var d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;"
        "var n = 0; for (var i = 3; i < d.length; i += 4) { if (d[i] > 0) n++; } return n;"
    )
    assert painted > 0, "the rates chart's canvas is blank"
    freshness = driver.execute_script(
        "return window.materializerCharts.freshness.data[2].filter(function (v) {"
        " return v !== null; }).length;"
    )
    assert freshness > 0, "no freshness p99 in the history"

    # The entity browser finds a key produced now, with its watermark; a script is text.
    key = f"hostile-{uuid.uuid4().hex[:6]}"
    produce(kafka, topics[0], [_event(key, 1, name=HOSTILE)])

    def found() -> bool:
        loaded(f"{base}/maps/{first}/entities?op=get&key={key}")
        return bool(driver.find_elements(By.CSS_SELECTOR, "#entities pre.entity"))

    _wait(driver, "the produced key in the entity browser", found)
    assert "batch" in driver.find_element(By.ID, "watermark").text
    assert HOSTILE in driver.find_element(By.CSS_SELECTOR, "#entities pre.entity").text
    assert driver.execute_script("return window.hostile === undefined;")
    assert not driver.find_elements(By.CSS_SELECTOR, "#entities script")
    assert "curl" in driver.find_element(By.ID, "command-curl").text
    save_screenshot(driver, "console-entities")

    # The live changes show a change made after the page opened.
    loaded(f"{base}/maps/{first}/changes")
    _wait(driver, "the change stream open", lambda: "Watching" in driver.find_element(
        By.ID, "changes-state").text)  # fmt: skip
    fresh = f"fresh-{uuid.uuid4().hex[:6]}"
    produce(kafka, topics[0], [_event(fresh, 2)])
    _wait(driver, "the new change on the page", lambda: driver.find_elements(
        By.CSS_SELECTOR, f"#changes tr[data-key='{fresh}']"))  # fmt: skip
    save_screenshot(driver, "console-changes")

    # Every page and fragment answers with what the run wrote (fetched with the session).
    fetched = driver.execute_async_script(
        "var done = arguments[arguments.length - 1]; var urls = arguments[0];"
        "Promise.all(urls.map(function (u) { return fetch(u).then(function (r) {"
        " return r.text().then(function (t) { return [r.status, t]; }); }); }))"
        ".then(done);",
        [f"{base}/fragments/overview", f"{base}/maps/{first}/summary",
         f"{base}/maps/{first}/history.json", f"{base}/maps/{first}/edit", f"{base}/new-map",
         f"{base}/maps/{first}/entities?op=query&where=age%20%3E%3D%200"],
    )  # fmt: skip
    assert [status for status, _ in fetched] == [200] * len(fetched), fetched
    overview, summary, history, edit, _, query = (text for _, text in fetched)
    assert all(f'data-map="{n}"' in overview for n in names)
    assert 'id="map-state"' in summary
    assert len(orjson.loads(history)["t"]) >= 2
    assert topics[0] in edit
    assert "Delta table version" in query and 'data-key="k1"' in query

    # The query pages through the table, a page of 10 rows at a time.
    def keys_shown() -> list[str]:
        rows = driver.find_elements(By.CSS_SELECTOR, "#entities tr[data-key]")
        return [str(r.get_attribute("data-key")) for r in rows]

    loaded(f"{base}/maps/{first}/entities?op=query&where=age%20%3E%3D%200&page_size=10")
    page_one = keys_shown()
    driver.find_element(By.ID, "next-page").click()
    page_two = keys_shown()
    assert len(page_one) == len(page_two) == 10 and not set(page_one) & set(page_two)

    # A record that cannot be decoded: the map's page lists it with where it came from.
    produce(kafka, topics[0], [(b"broken", b"{not json")])

    def dead_letter_listed() -> bool:
        loaded(f"{base}/maps/{first}")
        return bool(driver.find_elements(By.CSS_SELECTOR, "#dead-letters tbody tr"))

    _wait(driver, "the dead letter on the map's page", dead_letter_listed)
    row = driver.find_element(By.CSS_SELECTOR, "#dead-letters tbody tr").text
    assert topics[0] in row and "broken" in row

    # Verify from the page: the run carries it out and the page shows its result.
    driver.find_element(By.ID, "action-verify").click()

    def verified() -> bool:
        found = driver.find_elements(By.ID, "operation")
        return bool(found) and "done" in found[0].text

    _wait(driver, "the verify done on the map's page", verified)
    assert '"identical": true' in driver.find_element(By.ID, "operation").text.replace(
        '":true', '": true')  # fmt: skip

    # Pause then resume from the page: the state the CLI reports follows.
    loaded(f"{base}/maps/{first}")
    driver.find_element(By.ID, "action-pause").click()
    _wait(driver, "paused in materializer status", lambda: _status(config_file, first) == "paused")
    assert "Done: pause" in driver.find_element(By.ID, "notice").text
    driver.find_element(By.ID, "action-resume").click()
    running = ("running", "catching_up")
    _wait(driver, "running again", lambda: _status(config_file, first) in running)
    loaded(f"{base}/maps/{first}")
    _wait(driver, "the charts again", charted)
    save_screenshot(driver, "console-map")
    errors = console_errors(driver)
    assert not errors, errors

    # A read-only token: no action buttons, and an action posted anyway is refused.
    driver.find_element(By.CSS_SELECTOR, ".who button").click()
    login(READER)
    loaded(f"{base}/maps/{first}")
    assert not driver.find_elements(By.CSS_SELECTOR, "[id^=action-]")
    status = driver.execute_async_script(
        "var done = arguments[arguments.length - 1];"
        "var body = new URLSearchParams({csrf: document.body.getAttribute('data-csrf')});"
        f"fetch('{base}/maps/{first}/actions/pause', {{method: 'POST', body: body}})"
        ".then(function (r) { done(r.status); });"
    )
    assert status == 403
    assert _status(config_file, first) in running
    save_screenshot(driver, "console-read-only")
    # The refused request is the only error the page saw.
    left = [e for e in console_errors(driver) if "403" not in e]
    assert not left, left
