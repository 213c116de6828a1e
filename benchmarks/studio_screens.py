"""Studio screenshots for issue 42's closing note (its "Done when"): real runs, real browser.

Builds, in a temporary home, with the real CLI:

- a flow SIGKILLed while ``b`` is in flight, then resumed (``steerflow resume``);
- a 300-node run (30 chains of 10, the offline ``echo`` model), as ``benchmarks/studio.py``;
- a run waiting for an approval (a ``post`` tool call with ``approval: required``).

Then starts ``steerflow studio --port 0`` and saves PNGs with Playwright and Debian's
Chromium (``$STEERFLOW_CHROMIUM`` or ``/usr/bin/chromium``) at 1280x900: the crashed run,
its resume, the 300-node run zoomed to fit, the event log filtered to one node, the
approvals page (light), and the approvals page and resumed run in dark mode.

    .venv/bin/python benchmarks/studio_screens.py --out docs/studio

Prints each file with its size. Nothing asserted: the tests check behaviour.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from playwright.sync_api import Page, sync_playwright

from steerflow import views
from steerflow.state import StateDB, db_exists

TESTS = Path(__file__).resolve().parents[1] / "tests"
CHROMIUM = os.environ.get("STEERFLOW_CHROMIUM", "/usr/bin/chromium")
T = TypeVar("T")


def wait(check: Callable[[], T | None], what: str, timeout: float = 120.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def steerflow(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "steerflow", "--home", str(home), *args]


def write(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def run_json(home: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        steerflow(home, *args), capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"steerflow {' '.join(args)} failed: {out.stderr}")
    return dict(json.loads(out.stdout))


def crashed_and_resumed(home: Path, work: Path) -> tuple[str, str]:
    plan = [
        {"agent_id": "fetch", "instruction": "fetch the rows"},
        {"agent_id": "transform", "instruction": "transform them", "depends_on": ["fetch"]},
        {"agent_id": "load", "instruction": "load them", "depends_on": ["transform"]},
        {"agent_id": "report", "instruction": "write the report", "depends_on": ["load"]},
    ]
    write(work / "plan.yaml", {"name": "nightly import", "plan": plan})
    script = write(work / "script.yaml", {"fetch": {"delay": 0.5}, "transform": {"delay": 120}})
    args = ["flow", "--plan", str(work / "plan.yaml"), "--model", f"script:{script}", "--json"]
    proc = subprocess.Popen(steerflow(home, *args), stdout=subprocess.PIPE, text=True)

    def transform_running() -> str | None:
        if not db_exists(home):
            return None
        with StateDB.open(home, create=False) as db:
            rows = db.list_sessions(limit=1)
        if not rows or not rows[0].run_id:
            return None
        view = views.show_run(home, rows[0].run_id)
        node = view.node("transform")
        return rows[0].run_id if node is not None and node.status == "running" else None

    crashed = wait(transform_running, "transform running")
    proc.kill()  # SIGKILL mid-node: no finish recorded
    proc.wait(timeout=30)
    write(script, {})
    resumed = str(run_json(home, "resume", crashed, "--json")["run_id"])
    return crashed, resumed


def big_run(home: Path, work: Path, nodes: int = 300, layers: int = 10) -> str:
    width = nodes // layers
    plan = [
        {"agent_id": f"n{i:05d}", "instruction": f"step {i}",
         **({"depends_on": [f"n{i - width:05d}"]} if i >= width else {})}
        for i in range(nodes)
    ]  # fmt: skip
    write(work / "big.yaml", {"name": "backfill 300", "plan": plan})
    args = ["flow", "--plan", str(work / "big.yaml"), "--model", "echo", "--concurrency", "64"]
    return str(run_json(home, *args, "--json")["run_id"])


def waiting_for_approval(home: Path, work: Path) -> subprocess.Popen[str]:
    steps = [{"tool_calls": [{"name": "post", "args": {"message": "deploy done"}}]},
             {"response": "ok"}]  # fmt: skip
    script = write(work / "s.yaml", {"announce": {"steps": steps}})
    entry = {"agent_id": "announce", "instruction": "tell the team",
             "tools": ["python:tool_fns:post"]}  # fmt: skip
    plan = {"name": "release notes", "tool_options": {"post": {"approval": "required"}},
            "plan": [entry]}  # fmt: skip
    write(work / "p.yaml", plan)
    env = {**os.environ, "TOOL_LEDGER": str(work / "ledger.jsonl"), "PYTHONPATH": str(TESTS)}
    argv = steerflow(home, "flow", "--plan", str(work / "p.yaml"), "--model",
                     f"script:{script}", "--allow-python", "--json")  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip


def shoot(page: Page, path: Path) -> None:
    page.screenshot(path=str(path))
    print(f"{path}  {path.stat().st_size // 1024} KB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/studio"))
    args = parser.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir(mode=0o700)
        crashed, resumed = crashed_and_resumed(home, work)
        big = big_run(home, work)
        approval = waiting_for_approval(home, work)
        log = open(work / "studio.out", "w")  # noqa: SIM115 - closed in finally
        studio = subprocess.Popen(
            steerflow(home, "studio", "--port", "0"), stdout=log, stderr=subprocess.DEVNULL
        )
        try:
            url = wait(
                lambda: (
                    (m := re.search(r"(http://\S+)", (work / "studio.out").read_text()))
                    and m.group(1)
                ),
                "the studio's URL",
            )
            base = url.split("/?", 1)[0]
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
                try:
                    for scheme in ("light", "dark"):
                        page = browser.new_page(
                            viewport={"width": 1280, "height": 900}, color_scheme=scheme
                        )
                        page.goto(url)  # the token becomes the session cookie
                        if scheme == "light":
                            page.goto(f"{base}/runs/{crashed}")
                            shoot(page, out / "crashed-run.png")
                            page.goto(f"{base}/runs/{resumed}")
                            shoot(page, out / "resumed-run.png")
                            page.goto(f"{base}/runs/{big}?zoom=fit")
                            # The graph under the sticky run header, as an operator scrolls to it.
                            page.evaluate(
                                "window.scrollTo(0, document.getElementById('graph-tools')"
                                ".getBoundingClientRect().top + window.scrollY"
                                " - document.getElementById('run-header').offsetHeight - 24)"
                            )
                            shoot(page, out / "run-300-nodes-fit.png")
                            page.goto(f"{base}/runs/{resumed}/events?node=transform")
                            shoot(page, out / "events-one-node.png")
                            page.goto(f"{base}/runs")
                            shoot(page, out / "runs.png")
                        else:
                            page.goto(f"{base}/runs/{resumed}")
                            shoot(page, out / "resumed-run-dark.png")

                        def listed(page: Page = page) -> bool:
                            if page.locator("table.approvals tr[id^='apr_']").count():
                                return True
                            page.goto(f"{base}/approvals")
                            return False

                        page.goto(f"{base}/approvals")
                        wait(listed, "a request on the approvals page")
                        shoot(page, out / f"approvals{'-dark' if scheme == 'dark' else ''}.png")
                        page.close()
                finally:
                    browser.close()
        finally:
            studio.terminate()
            studio.wait(timeout=30)
            log.close()
            approval.kill()
            approval.communicate(timeout=30)


if __name__ == "__main__":
    main()
