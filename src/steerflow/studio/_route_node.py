"""The Node page and the download of a node's recorded artifacts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route

from steerflow import views
from steerflow.errors import AmbiguousIdError, RefusedError, UnknownIdError
from steerflow.plan import is_agent_id
from steerflow.studio import _node_live
from steerflow.studio._pages import error_page
from steerflow.studio._routing import Page, StudioState, is_target
from steerflow.studio._run_pages import node_page

__all__ = ["routes"]


class NodePage(Page):
    """``/runs/{target}/nodes/{node}`` and its artifacts."""

    def node(self, request: Request) -> Response:
        target, key = request.path_params["target"], request.path_params["node"]
        if not is_target(target) or not is_agent_id(key):
            return HTMLResponse(error_page("not found", "no such node"), 404)
        try:
            detail = views.node_detail(self.home, target, key)
            run = views.show_run(self.home, detail.run_id)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        # Read after the detail: a node that ended in between shows its whole stream.
        kept = None
        if run.reachable and detail.status not in _node_live.STREAMING:
            running = run.status == "running"
            kept = _node_live.kept_output_whole(run.run_dir, detail.id, run_running=running)
        elif run.reachable:
            kept = _node_live.kept_output(run.run_dir, detail.id)
        return HTMLResponse(node_page(detail, kept))

    def artifact(self, request: Request) -> Response:
        target, key = request.path_params["target"], request.path_params["node"]
        path = request.path_params["path"]
        if not is_target(target) or not is_agent_id(key):
            return HTMLResponse(error_page("not found", "no such node"), 404)
        try:
            opened = views.open_artifact(self.home, target, key, path)
        except (UnknownIdError, AmbiguousIdError) as exc:
            return HTMLResponse(error_page("not found", str(exc)), 404)
        except RefusedError as exc:
            return HTMLResponse(error_page("refused", str(exc)), 409)
        name = path.rsplit("/", 1)[-1]
        return StreamingResponse(
            _chunks(opened.fd),
            media_type="application/octet-stream",
            headers={
                # Never rendered in the studio's origin: an artifact is data, not a page.
                "content-disposition": f"attachment; filename*=UTF-8''{quote(name, safe='')}",
                "content-length": str(opened.size),
                "x-steerflow-recorded-digest": str(opened.record.get("digest") or ""),
            },
        )

    def node_output(self, request: Request) -> Response:
        return _node_live.node_output(self.home, request)

    def last_lines(self, request: Request) -> Response:
        return _node_live.last_lines(self.home, request)


def routes(state: StudioState) -> list[Route]:
    """The Node page's routes, with its live output (issue 31: studio/_node_live.py)."""
    page = NodePage(state)
    return [
        Route("/runs/{target}/nodes/{node}", page.node, methods=["GET"]),
        Route("/runs/{target}/nodes/{node}/artifacts/{path:path}", page.artifact, methods=["GET"]),
        Route("/api/runs/{target}/nodes/{node}/output", page.node_output, methods=["GET"]),
        Route("/api/runs/{target}/last-lines", page.last_lines, methods=["GET"]),
        Route("/static/node-live.js", _node_live.script, methods=["GET"]),
    ]


def _chunks(fd: int, size: int = 1 << 20) -> Iterator[bytes]:
    """The file's bytes (Starlette iterates this in a worker thread); closes ``fd``."""
    try:
        while chunk := os.read(fd, size):
            yield chunk
    finally:
        os.close(fd)
