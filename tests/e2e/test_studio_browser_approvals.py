"""The Studio's approvals page in Chromium (issue 41 item 4): a tool call waits, the page
lists it with its arguments as inert text, and the operator approves it with edited
arguments by the page's own form (CSRF token included); the flow then runs the call.

Uses the browser fixtures of ``test_studio_browser.py`` (Debian's Chromium via Playwright).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from ctl_support import clean_env, steerflow_argv, wait_for, write_yaml
from playwright.sync_api import expect
from test_studio_browser import XSS, Watched, _inert, _shot, browser, studio_process, watched

__all__ = ["browser", "watched"]  # the fixtures this module uses, imported on purpose

TESTS = Path(__file__).resolve().parents[1]


def _ledger(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "ledger.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_the_approvals_page_approves_with_edited_arguments(
    tmp_path: Path, watched: Watched
) -> None:
    home = tmp_path / "home"
    steps = [{"tool_calls": [{"name": "post", "args": {"message": XSS}}]}, {"response": "ok"}]
    script = write_yaml(tmp_path / "s.yaml", {"a": {"steps": steps}})
    entry = {"agent_id": "a", "instruction": "tell the team", "tools": ["python:tool_fns:post"]}
    plan = {"tool_options": {"post": {"approval": "required"}}, "plan": [entry]}
    write_yaml(tmp_path / "p.yaml", plan)
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    env = clean_env({"TOOL_LEDGER": str(tmp_path / "ledger.jsonl"), "PYTHONPATH": path})
    argv = steerflow_argv(home, "flow", "--plan", str(tmp_path / "p.yaml"), "--model",
                          f"script:{script}", "--allow-python", "--json")  # fmt: skip
    flow = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    try:
        with studio_process(home) as s:
            page = watched.page()
            page.goto(s.url)  # the token becomes the session cookie
            page.goto(s.base + "/approvals")

            def listed() -> bool:
                if flow.poll() is not None:
                    raise AssertionError(f"the flow ended early: {flow.communicate()}")
                if page.locator("table.approvals tr[id^='apr_']").count():
                    return True
                page.reload()
                return False

            wait_for(listed, timeout=60, interval=0.2, what="a request on the approvals page")
            row = page.locator("table.approvals tr[id^='apr_']")
            expect(row).to_contain_text("tool post")
            expect(row).to_contain_text("<script>alert(1)</script>")  # text, not markup
            _inert(page)
            _shot(page, tmp_path / "approvals.png")
            row.locator("input[name=args]").fill('{"message": "safe text"}')
            row.get_by_role("button", name="Approve with these arguments").click()
            expect(page.locator("p.note")).to_contain_text("queued decision")
        _out, err = flow.communicate(timeout=60)
    finally:
        if flow.poll() is None:
            flow.kill()
            flow.communicate(timeout=10)
    assert flow.returncode == 0, err
    assert _ledger(tmp_path) == [{"tool": "post", "message": "safe text"}]
