// Materializer console: the parts of the pages that run in the browser.
// Everything the server sends is inserted as text, never as HTML: entities are user data.
(function () {
  "use strict";

  var body = document.body;
  var csrf = body.getAttribute("data-csrf") || "";
  var charts = {};
  window.materializerCharts = charts;

  document.addEventListener("htmx:configRequest", function (event) {
    event.detail.headers["X-CSRF-Token"] = csrf;
  });

  function localTimes(root) {
    root.querySelectorAll(".when[data-ms]").forEach(function (cell) {
      var ms = Number(cell.getAttribute("data-ms"));
      if (ms > 0) { cell.textContent = new Date(ms).toLocaleString(); }
    });
  }

  // -- charts of a map's history ------------------------------------------------------

  var PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

  function makeChart(figure, width) {
    var names = figure.getAttribute("data-series").split(",");
    var unit = figure.getAttribute("data-unit") || "";
    var title = document.createElement("figcaption");
    title.textContent = figure.getAttribute("data-title");
    figure.appendChild(title);
    var series = [{}];
    names.forEach(function (name, i) {
      series.push({
        label: name.replace(/_/g, " "),
        stroke: PALETTE[i % PALETTE.length],
        width: 1.5,
        spanGaps: false,
        value: function (u, v) { return v == null ? "–" : (Math.round(v * 100) / 100) + " " + unit; }
      });
    });
    var data = [[]];
    names.forEach(function () { data.push([]); });
    var chart = new uPlot({
      width: width,
      height: 180,
      series: series,
      axes: [{}, { size: 60 }],
      scales: { x: { time: true } },
      legend: { live: true }
    }, data, figure);
    chart.seriesNames = names;
    charts[figure.getAttribute("data-chart")] = chart;
    return chart;
  }

  function startCharts(container) {
    var url = container.getAttribute("data-history");
    var figures = container.querySelectorAll("figure.chart");
    var width = Math.max(320, Math.floor(container.clientWidth / 2) - 24);
    var made = [];
    figures.forEach(function (figure) { made.push(makeChart(figure, width)); });
    function refresh() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (answer) {
          if (!answer.ok) { throw new Error("history: HTTP " + answer.status); }
          return answer.json();
        })
        .then(function (history) {
          var times = history.t.map(function (ms) { return ms / 1000; });
          made.forEach(function (chart) {
            var data = [times];
            chart.seriesNames.forEach(function (name) {
              data.push(history.series[name] || times.map(function () { return null; }));
            });
            chart.setData(data);
          });
        })
        .catch(function (error) { container.setAttribute("data-error", String(error)); });
    }
    refresh();
    setInterval(refresh, 5000);
  }

  // -- live changes -------------------------------------------------------------------

  function startChanges(table) {
    var rows = table.querySelector("tbody");
    var state = document.getElementById("changes-state");
    var source = new EventSource(table.getAttribute("data-stream"));
    source.addEventListener("open", function () { state.textContent = "Watching: new changes appear at the top."; });
    source.addEventListener("change", function (event) {
      var change = JSON.parse(event.data);
      var row = document.createElement("tr");
      row.setAttribute("data-key", change.key);
      [new Date().toLocaleTimeString(), change.key, change.op,
       change.entity === undefined ? "" : JSON.stringify(change.entity)].forEach(function (text, i) {
        var cell = document.createElement("td");
        if (i === 3) {
          var pre = document.createElement("pre");
          pre.className = "entity";
          pre.textContent = text;
          cell.appendChild(pre);
        } else {
          cell.textContent = text;
        }
        row.appendChild(cell);
      });
      rows.insertBefore(row, rows.firstChild);
      while (rows.children.length > 200) { rows.removeChild(rows.lastChild); }
    });
    source.addEventListener("error", function (event) {
      if (event.data) {
        state.textContent = "The stream ended: " + JSON.parse(event.data).error.message;
        source.close();
      } else {
        state.textContent = "Reconnecting…";
      }
    });
  }

  // -- the SQL editor: Ctrl+Enter (⌘+Enter) runs the statement -----------------------

  function runOnCtrlEnter(editor) {
    editor.addEventListener("keydown", function (event) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        editor.form.requestSubmit();
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    localTimes(document);
    var editor = document.getElementById("sql");
    if (editor) { runOnCtrlEnter(editor); }
    var container = document.getElementById("charts");
    if (container) { startCharts(container); }
    var changes = document.getElementById("changes");
    if (changes) { startChanges(changes); }
  });
  document.addEventListener("htmx:afterSwap", function (event) { localTimes(event.target); });
})();
