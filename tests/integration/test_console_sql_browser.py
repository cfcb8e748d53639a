"""The console's SQL page in a real browser (headless Chromium), served by ``query-service
serve`` as users start it: logged in, the SQL link opens the editor, Ctrl+Enter runs a
GROUP BY over two maps' Delta tables, and the page shows the rows computed here and the
tables read, logging no error. The page is saved as the ``console-sql`` screenshot."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import yaml
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from materializer.testing import free_port
from materializer.testing.process import ManagedProcess
from materializer.testing.waiting import wait_until
from tests.helpers.browser import console_errors, save_screenshot
from tests.helpers.query_redis import query_service_command
from tests.helpers.sql_tables import SqlMaps, expected_groups

TOKEN = "sql-browser-token-0123456789"
WAIT_S = 60.0


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_a_group_by_in_the_browser(
    browser: webdriver.Chrome, redis_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    maps = SqlMaps(tmp_path)
    maps.write()
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        yaml.safe_dump({"tokens": [{"name": "analyst", "token": TOKEN, "maps": ["*"],
                                    "verbs": ["*"]}]})
    )  # fmt: skip
    http_port = free_port()
    config_file = tmp_path / "maps.yaml"
    doc = maps.doc(redis_url, {"tokens_file": str(tokens)}, kafka_bootstrap, http_port=http_port)
    config_file.write_text(yaml.safe_dump(doc))
    query = ManagedProcess(
        [*query_service_command(), "serve", "-c", str(config_file), "--port", "0",
         "--metrics-port", "0"],
        tmp_path / "query.log",
    )  # fmt: skip
    base = f"http://127.0.0.1:{http_port}/ui"
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.2)
    try:
        wait_until("the query service's HTTP port", lambda: _listening(http_port), timeout=60)
        browser.get(f"{base}/")
        wait.until(lambda d: d.find_elements(By.ID, "token"), "the login form")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, ".login button[type=submit]").click()
        wait.until(lambda d: d.find_elements(By.ID, "nav-sql"), "the SQL link")
        browser.find_element(By.ID, "nav-sql").click()

        editor = wait.until(lambda d: d.find_element(By.ID, "sql"), "the editor")
        editor.send_keys(maps.group_by())
        editor.send_keys(Keys.CONTROL, Keys.ENTER)  # console.js submits the form
        wait.until(lambda d: d.find_elements(By.ID, "sql-answer"), "the answer")

        header = [
            th.text.split()[0] for th in browser.find_elements(By.CSS_SELECTOR, "#sql-answer th")
        ]
        assert header == ["tier", "orders", "total"]
        rows = [
            [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in browser.find_elements(By.CSS_SELECTOR, "#sql-answer tbody tr")
        ]
        assert rows == [[g["tier"], str(g["orders"]), str(g["total"])] for g in expected_groups()]
        assert browser.find_element(By.ID, "sql-summary").text.startswith("3 rows in ")
        read = browser.find_element(By.ID, "tables-read").text
        assert f"{maps.users}: version 1, watermark batch 7" in read
        assert f"{maps.orders}: version 1, watermark batch 7" in read
        assert browser.find_element(By.ID, "sql").get_attribute("value") == maps.group_by()
        assert "curl" in browser.find_element(By.ID, "command-curl").text
        save_screenshot(browser, "console-sql")
        assert console_errors(browser) == []
    except Exception:
        print(query.log()[-3000:], file=sys.stderr)
        raise
    finally:
        query.stop()
