"""The Studio's live output of running nodes (issue 31, decision 194).

Two JSON answers and one script, kept apart from the rest of the Studio:

* ``GET /api/runs/{target}/nodes/{node}/output?segment=S&offset=O``: the node's live text
  from that position on (the position the previous answer returned), the next position,
  and whether it is over (its call ended and its status is no longer running, or the run
  ended). The browser keeps the position, so the server keeps no per-viewer state.
* ``GET /api/runs/{target}/last-lines``: the last non-empty line of each running node.
* ``/static/node-live.js`` polls them and writes with ``textContent`` only (the CSP has
  ``script-src 'self'`` and no inline script); the text is never parsed as HTML.

The node page renders what the files hold so far on the server (:func:`kept_output`):
while the node runs the script goes on from the position the page was rendered at, so a
reload (the page reloads when the node's status moves) shows everything streamed so far
and then the rest; once the node ended, the page keeps the streamed text beside the
recorded response (:func:`kept_section`), readable without JavaScript.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from steerflow import views
from steerflow._live import LiveCursor, live_dir
from steerflow.errors import AmbiguousIdError, UnknownIdError
from steerflow.home import is_run_id
from steerflow.plan import is_agent_id

__all__ = [
    "NODE_LIVE_SCRIPT",
    "STREAMING",
    "KeptOutput",
    "kept_output",
    "kept_output_whole",
    "kept_section",
    "last_lines",
    "lines_section",
    "live_section",
    "node_output",
    "script",
]

POLL_MS = 300
_TAIL_READ = 4096


def _view(home: Path, target: str) -> dict[str, Any] | None:
    if not is_run_id(target):
        return None
    try:
        return views.show_run(home, target).to_json()
    except (UnknownIdError, AmbiguousIdError):
        return None


def _position(request: Request) -> tuple[int, int]:
    try:
        segment = int(request.query_params.get("segment", "0"))
        offset = int(request.query_params.get("offset", "0"))
    except ValueError:
        return 0, 0
    return max(0, segment), max(0, offset)


def node_output(home: Path, request: Request) -> Response:
    """The node's live text from the asked position on (blocking I/O: run in a thread).

    An answer is at most what the node's files hold (``STEERFLOW_LIVE_MAX_BYTES``).
    """
    target, key = request.path_params["target"], request.path_params["node"]
    view = _view(home, target) if is_agent_id(key) else None
    status = (
        None if view is None else next((n["status"] for n in view["nodes"] if n["id"] == key), None)
    )
    if view is None or status is None:
        return JSONResponse({"error": "no such node"}, 404)
    segment, offset = _position(request)
    kept = kept_output(Path(view["run_dir"]), key, segment=segment, offset=offset)
    over = view["status"] != "running" or (kept.ended and status not in ("running", "pending"))
    return JSONResponse(
        {
            "text": kept.text,
            "segment": kept.segment,
            "offset": kept.offset,
            "status": status,
            "done": over,
        },
        headers={"cache-control": "no-store"},
    )


def last_lines(home: Path, request: Request) -> Response:
    """The last line each running node produced so far (the Run page shows them)."""
    view = _view(home, request.path_params["target"])
    if view is None:
        return JSONResponse({"error": "no such run"}, 404)
    lines: dict[str, str] = {}
    for node in view["nodes"]:
        if node["status"] == "running":
            line = _last_line(live_dir(Path(view["run_dir"]), node["id"]))
            if line:
                lines[node["id"]] = line
    return JSONResponse({"lines": lines}, headers={"cache-control": "no-store"})


def _last_line(directory: Path) -> str:
    try:
        newest = max(
            (p for p in directory.glob("*.txt") if p.stem.isdigit()), key=lambda p: int(p.stem)
        )
        with open(newest, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - _TAIL_READ))
            data = handle.read()
    except (OSError, ValueError):
        return ""
    decoded = strip_ansi(data.decode("utf-8", errors="replace"))
    lines = [line for line in decoded.splitlines() if line.strip()]
    return lines[-1][-300:] if lines else ""


@dataclass(frozen=True)
class KeptOutput:
    """A node's live text as its files hold it now, and where a reader goes on from."""

    text: str
    segment: int
    offset: int
    ended: bool


def kept_output(run_dir: Path, node_key: str, *, segment: int = 0, offset: int = 0) -> KeptOutput:
    """What the node's live files hold from ``segment``/``offset`` on (blocking I/O)."""
    cursor = LiveCursor(live_dir(run_dir, node_key), segment=segment, offset=offset)
    try:
        ended = cursor.ended
        text = cursor.read()
        segment, offset = cursor.position
    finally:
        cursor.close()
    # A sequence cut at the end of what was read is read again whole next time.
    cut = _PARTIAL_ESCAPE.search(text)
    if cut is not None and not ended:
        size = len(cut.group().encode("utf-8"))
        if size <= offset:
            text, offset = text[: cut.start()], offset - size
    return KeptOutput(strip_ansi(text), segment, offset, ended)


#: A node page in these statuses polls the stream; in any other it keeps what streamed.
STREAMING = frozenset({"pending", "running", "paused"})
#: How long an ended node's page waits for the live writer's end mark (decision 396).
END_MARK_WAIT_S = 2.0


def kept_output_whole(run_dir: Path, node_key: str, *, run_running: bool) -> KeptOutput:
    """:func:`kept_output` of an ended node, once its live files are whole (blocking).

    The live writer appends a call's last chunks on its own tick, after the outcome may
    be published (decision 235): a page rendered on ``completed`` could keep the stream
    one chunk short, and it is not polled again. A node that streamed gets an end mark,
    so while its run is alive this waits for the mark, at most :data:`END_MARK_WAIT_S`.
    """
    kept = kept_output(run_dir, node_key)
    deadline = time.monotonic() + END_MARK_WAIT_S
    while run_running and kept.text and not kept.ended and time.monotonic() < deadline:
        time.sleep(0.02)  # the writer's own tick is 20 ms (decision 196)
        kept = kept_output(run_dir, node_key)
    return kept


#: Terminal escape sequences: CSI (colours, cursor moves), OSC (titles, links), and the
#: two-byte ones. A model or a tool's output may carry them; shown raw they are boxes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
#: An escape sequence not finished yet at the end of a read.
_PARTIAL_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*)?$")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colour codes): the page shows text."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def live_section(output_url: str, esc: Any, kept: KeptOutput | None = None) -> str:
    """The node page's live output block: the text so far, then the script goes on."""
    kept = kept or KeptOutput("", 0, 0, False)
    return (
        f'<section id="live-output" data-output="{esc(output_url)}" '
        f'data-segment="{kept.segment}" data-offset="{kept.offset}">'
        '<h3>live output <span id="live-state">(streaming)</span></h3>'
        f'<pre id="live-text" class="live">{esc(kept.text)}</pre></section>'
        '<script src="/static/node-live.js" defer></script>'
    )


def kept_section(kept: KeptOutput | None, esc: Any) -> str:
    """An ended node's streamed text, kept beside its recorded response (no polling)."""
    if kept is None or not kept.text:
        return ""
    return (
        '<section id="live-kept"><h3>live output as streamed</h3>'
        "<p>what the call streamed while it ran, as the run's live files keep it (the head"
        " and the tail of a long one); the response above is the recorded one</p>"
        f'<pre id="live-kept-text" class="live">{esc(kept.text)}</pre></section>'
    )


def lines_section(lines_url: str, esc: Any) -> str:
    """The run page's "running now" block: each running node's last line."""
    return (
        f'<section id="live-lines" data-lines="{esc(lines_url)}">'
        '<h3>running now</h3><ul id="live-lines-list"></ul></section>'
        '<script src="/static/node-live.js" defer></script>'
    )


def script(request: Request) -> Response:
    """``/static/node-live.js``."""
    return Response(NODE_LIVE_SCRIPT, media_type="text/javascript")


NODE_LIVE_SCRIPT = """\
(function () {
  "use strict";
  function poll(url, apply, every) {
    function tick() {
      fetch(url(), {credentials: "same-origin", cache: "no-store"})
        .then(function (r) { return r.status === 200 ? r.json() : null; })
        .then(function (answer) { return answer ? apply(answer) : true; })
        .catch(function () { return true; })
        .then(function (more) { if (more) { window.setTimeout(tick, every); } });
    }
    tick();
  }
  var output = document.getElementById("live-output");
  if (output) {
    var base = output.getAttribute("data-output");
    var text = document.getElementById("live-text");
    var state = document.getElementById("live-state");
    // The server rendered the text up to this position: go on from there.
    var at = {segment: Number(output.getAttribute("data-segment")) || 0,
              offset: Number(output.getAttribute("data-offset")) || 0};
    poll(function () {
      return base + "?segment=" + at.segment + "&offset=" + at.offset;
    }, function (a) {
      if (a.text) { text.textContent += a.text; }
      at = {segment: a.segment, offset: a.offset};
      state.textContent = a.done ? "(" + a.status + ")" : "(streaming)";
      output.setAttribute("data-done", a.done ? "1" : "0");
      return !a.done || Boolean(a.text);
    }, __POLL_MS__);
  }
  var lines = document.getElementById("live-lines");
  if (lines) {
    var list = document.getElementById("live-lines-list");
    poll(function () { return lines.getAttribute("data-lines"); }, function (a) {
      while (list.firstChild) { list.removeChild(list.firstChild); }
      Object.keys(a.lines || {}).sort().forEach(function (key) {
        var li = document.createElement("li");
        li.setAttribute("data-last-line", key);
        var name = document.createElement("code");
        name.textContent = key;
        li.appendChild(name);
        li.appendChild(document.createTextNode(" " + a.lines[key]));
        list.appendChild(li);
      });
      return true;
    }, 1000);
  }
})();
""".replace("__POLL_MS__", str(POLL_MS))
