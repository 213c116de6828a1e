"""The Studio's one script, served from ``/static/studio.js`` (the CSP allows no inline script).

It polls the page's ``data-live`` JSON (``show --json`` of the run; 304 while nothing
changed, see ``_live``) and updates statuses
with ``textContent`` and class names only, never HTML; when a node appears that the page
does not draw (a spawn), it reloads the page, which the server renders escaped. Once a form
of the page is sent it never reloads: the reload would replace the navigation the form
started, and the page the answer redirects to (its "queued control" notice) would never
show (decision 236).
"""

from __future__ import annotations

__all__ = ["POLL_MS", "SCRIPT"]

#: How often a Run page asks for the run's state (updates land within a second).
POLL_MS = 500

SCRIPT = """\
(function () {
  "use strict";
  var source = document.body.getAttribute("data-live");
  if (!source) { return; }
  var kind = document.body.getAttribute("data-live-kind");
  var NODE = ["pending", "running", "paused", "completed", "failed", "skipped",
              "interrupted"];
  // As the server's duration(): the same text whether rendered or updated.
  function duration(s) {
    if (s === null || s === undefined) { return "-"; }
    if (s < 60) { return s.toFixed(1) + "s"; }
    var m = Math.floor(s / 60), rest = Math.floor(s) % 60, h = Math.floor(m / 60);
    m = m % 60;
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return h ? h + "h" + two(m) + "m" : m + "m" + two(rest) + "s";
  }
  var RUN = ["running", "completed", "failed", "timed_out", "interrupted", "stopped",
             "budget_exhausted"];
  function setStatus(el, status, known) {
    var keep = (el.getAttribute("class") || "").split(/\\s+/).filter(function (c) {
      return c && c.indexOf("status-") !== 0;
    });
    keep.push("status-" + (known.indexOf(status) >= 0 ? status : "unknown"));
    el.setAttribute("class", keep.join(" "));
  }
  // A form sent (Pause, Send, Set cap, a filter) is a navigation on its way: a reload
  // now would replace it, and a control the form queued moves the answers that trigger
  // one (decision 236). Every form of the studio navigates, so the flag never sticks.
  var leaving = false;
  document.addEventListener("submit", function () { leaving = true; }, true);
  function reload() {
    if (!leaving) { leaving = true; window.location.reload(); }
  }
  // A field the operator is in, or changed from what the server rendered (the search
  // box holds its query after a search: that is no edit), keeps the page: a reload
  // would wipe it (issue 42).
  function typing() {
    var fields = document.querySelectorAll(
      "input[type=text], input[type=search], textarea, select");
    for (var i = 0; i < fields.length; i += 1) {
      var f = fields[i];
      if (f === document.activeElement) { return true; }
      if (f.tagName === "SELECT") {
        for (var j = 0; j < f.options.length; j += 1) {
          if (f.options[j].selected !== f.options[j].defaultSelected) { return true; }
        }
      } else if (f.value !== f.defaultValue) { return true; }
    }
    return false;
  }
  function applyRuns(list) {
    var byId = {};
    (list.runs || []).forEach(function (r) { byId[r.session_id] = r; });
    var shown = {};
    var stale = false;
    document.querySelectorAll("tr[data-run]").forEach(function (tr) {
      var id = tr.getAttribute("data-run");
      var r = byId[id];
      shown[id] = true;
      if (!r) { return; }
      if (r.status !== tr.getAttribute("data-status")) { stale = true; }
      tr.querySelectorAll("[data-field]").forEach(function (td) {
        var value = r[td.getAttribute("data-field")];
        if (value !== undefined) { td.textContent = value; }
      });
    });
    (list.runs || []).forEach(function (r) { if (!shown[r.session_id]) { stale = true; } });
    // A new run or a changed status changes links and forms: the server renders them.
    if (stale && !typing()) { reload(); }
  }
  // What the server rendered: forms, the recovery section, resume links and control
  // results change with these, and only the server renders them (escaped).
  var shownStatus = document.getElementById("run-status");
  var rendered = shownStatus ? shownStatus.textContent : null;
  var resumes = document.getElementById("run-resumes");
  var resumeCount = resumes ? resumes.getAttribute("data-count") : null;
  var answers = 0;
  var log = document.getElementById("control-log");
  var logCount = log ? log.getAttribute("data-count") : null;
  var nodeStatus = document.body.getAttribute("data-node-status");
  var DONE = ["completed", "failed", "skipped"];
  var baseline = null;
  function stale(view) {
    if (kind === "node") {
      var key = document.body.getAttribute("data-node");
      var mine = (view.nodes || []).filter(function (n) { return n.id === key; })[0];
      if (!mine) { return false; }
      // Against the first answer, not the page: the two readers may name a dead run's
      // node differently, and a reload must not loop. An end missed since load reloads.
      if (baseline === null) {
        baseline = mine.status;
        return DONE.indexOf(mine.status) >= 0 && DONE.indexOf(nodeStatus) < 0;
      }
      return mine.status !== baseline;
    }
    if (logCount !== null && view.control_count !== undefined &&
        String(view.control_count) !== logCount) {
      return true;
    }
    // Only an end reloads: a cached "running" answer must not bounce a fresh page.
    if (rendered && view.status && view.status !== rendered && view.status !== "running") {
      return true;
    }
    if (resumeCount !== null && String((view.resumed_by || []).length) !== resumeCount) {
      return true;
    }
    // A changed answer after the first: a pending control may have been stamped.
    return answers > 1 && document.querySelector("[data-control-pending]") !== null;
  }
  function apply(view) {
    answers += 1;
    if (stale(view) && !typing()) { reload(); return; }
    if (kind === "node") { return; }
    var byId = {};
    var byNode = {};
    var drawn = {};
    document.querySelectorAll("g[data-node]").forEach(function (g) {
      drawn[g.getAttribute("data-node")] = g;
    });
    var missing = false;
    (view.nodes || []).forEach(function (n) {
      byId[n.id] = n.status;
      byNode[n.id] = n;
      if (drawn[n.id]) { setStatus(drawn[n.id], n.status, NODE); } else { missing = true; }
    });
    if (missing) { reload(); return; }
    document.querySelectorAll("[data-node-status]").forEach(function (td) {
      var s = byId[td.getAttribute("data-node-status")];
      if (s) { td.textContent = s; }
    });
    // Durations and models move after load: a node that started or ended since.
    document.querySelectorAll("[data-node-duration]").forEach(function (td) {
      var n = byNode[td.getAttribute("data-node-duration")];
      if (n && "duration_s" in n) { td.textContent = duration(n.duration_s); }
    });
    document.querySelectorAll("[data-node-model]").forEach(function (td) {
      var n = byNode[td.getAttribute("data-node-model")];
      if (n && n.model) { td.textContent = n.model; }
    });
    timeline(view.nodes || []);
    var status = document.getElementById("run-status");
    if (status && view.status) {
      status.textContent = view.status;
      setStatus(status, view.status, RUN);
    }
    var phase = document.getElementById("run-phase");
    if (phase) { phase.textContent = view.status === "running" ? (view.phase || "-") : "-"; }
    var s = view.summary || {};
    var progress = document.getElementById("run-progress");
    if (progress) {
      progress.textContent = s.completed + " completed, " + s.failed + " failed, " +
        s.running + " running of " + s.total;
    }
  }
  // The Gantt bars from the live answer: a running node ends at start + duration_s (the
  // server's clock, not this browser's), then every bar is scaled to the new span.
  function timeline(nodes) {
    var svg = document.querySelector("svg.timeline");
    if (!svg) { return; }
    var x0 = parseFloat(svg.getAttribute("data-x0")), w = parseFloat(svg.getAttribute("data-w"));
    var times = {}, t0 = null, t1 = null;
    nodes.forEach(function (n) {
      var d = n.detail || {};
      if (typeof d.started_at !== "number") { return; }
      var end = typeof d.ended_at === "number" ? d.ended_at :
        d.started_at + (typeof n.duration_s === "number" ? n.duration_s : 0);
      times[n.id] = [d.started_at, end, n.status];
      t0 = t0 === null ? d.started_at : Math.min(t0, d.started_at);
      t1 = t1 === null ? end : Math.max(t1, end);
    });
    if (t0 === null) { return; }
    var span = Math.max(t1 - t0, 0.001);
    // Every part of the timeline (a long run's rows past the first fold away).
    document.querySelectorAll("svg.timeline rect[data-bar]").forEach(function (bar) {
      var t = times[bar.getAttribute("data-bar")];
      if (!t) { return; }
      bar.setAttribute("x", (x0 + (t[0] - t0) / span * w).toFixed(1));
      bar.setAttribute("width", Math.max(2, (t[1] - t[0]) / span * w).toFixed(1));
      setStatus(bar, t[2], NODE);
    });
    var end = document.getElementById("timeline-end");
    if (end) { end.textContent = duration(span); }
  }
  var tag = null;
  function tick() {
    var headers = tag ? {"If-None-Match": tag} : {};
    fetch(source, {credentials: "same-origin", cache: "no-store", headers: headers})
      .then(function (r) {
        if (r.status !== 200) { return null; }
        tag = r.headers.get("ETag");
        return r.json();
      })
      .then(function (view) {
        if (!view) { return; }
        if (kind === "runs") { applyRuns(view); } else { apply(view); }
      })
      .catch(function () { return null; })
      .then(function () { window.setTimeout(tick, __POLL_MS__); });
  }
  window.setTimeout(tick, __POLL_MS__);
})();
""".replace("__POLL_MS__", str(POLL_MS))
