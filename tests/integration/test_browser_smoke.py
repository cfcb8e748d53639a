"""The browser set-up end to end: a page served by aiohttp loads the console's vendored
htmx and uPlot, htmx swaps in a fragment from the server, uPlot draws a chart, and the
console stays clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from selenium import webdriver
from selenium.webdriver.support.wait import WebDriverWait

from tests.helpers.browser import console_errors, save_screenshot, served

STATIC = Path(__file__).resolve().parents[2] / "query_service" / "console" / "static"

PAGE = """<!doctype html>
<html>
<head>
  <meta charset="utf-8">
  <title>browser smoke</title>
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="/static/vendor/uPlot.min.css">
  <script src="/static/vendor/htmx.min.js"></script>
  <script src="/static/vendor/uPlot.iife.min.js"></script>
</head>
<body>
  <p id="fragment" hx-get="/fragment" hx-trigger="load">waiting</p>
  <div id="chart"></div>
  <script>
    window.chart = new uPlot(
      {
        width: 600,
        height: 300,
        series: [{}, {label: "events", stroke: "rgb(255, 0, 0)", width: 3}],
      },
      [[1, 2, 3], [10, 30, 20]],
      document.getElementById("chart"),
    );
  </script>
</body>
</html>
"""

RED_PIXELS = """
const canvas = window.chart.ctx.canvas;
const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
let painted = 0, red = 0;
for (let i = 0; i < data.length; i += 4) {
  if (data[i + 3] > 0) painted++;
  if (data[i] > 200 && data[i + 1] < 60 && data[i + 2] < 60 && data[i + 3] > 200) red++;
}
return [painted, red];
"""
"""How many pixels of the chart's canvas are painted at all, and how many in the
series' red: the axes alone paint some, the line of the three points the red ones."""


async def page(_: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/html")


async def fragment(_: web.Request) -> web.Response:
    return web.Response(text="swapped by htmx", content_type="text/html")


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/fragment", fragment)
    app.router.add_static("/static", STATIC)
    with served(app) as url:
        yield url


def test_the_vendored_scripts_load_swap_and_draw(browser: webdriver.Chrome, base: str) -> None:
    browser.get(base + "/")
    wait = WebDriverWait(browser, 10)
    wait.until(lambda d: d.find_element("id", "fragment").text == "swapped by htmx")
    assert browser.execute_script("return htmx.version").startswith("2.")
    assert browser.execute_script("return window.chart.data[1].length") == 3
    painted, red = wait.until(lambda d: (n := d.execute_script(RED_PIXELS))[1] and n)
    save_screenshot(browser, "browser-smoke")
    assert painted > red > 0
    assert console_errors(browser) == []


def test_console_errors_reads_what_the_page_logs(browser: webdriver.Chrome, base: str) -> None:
    browser.get(base + "/")
    browser.execute_script("console.error('smoke: logged on purpose')")
    browser.execute_script("console.info('smoke: not an error')")
    errors = console_errors(browser)
    assert len(errors) == 1
    assert "smoke: logged on purpose" in errors[0]
    assert console_errors(browser) == []  # read once
