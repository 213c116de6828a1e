"""``steerflow studio``: access rules and the Runs page, over real HTTP on loopback (issue 14).

The studio runs as a real ``steerflow studio --port 0`` subprocess; httpx talks to the URL
it prints. Runs and live flows are real CLI subprocesses. No browser here: what a browser
would enforce (HttpOnly, SameSite, CSP) is checked as the headers that instruct it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from ctl_support import (
    clean_env,
    count_controls,
    ctl_status,
    live_flow,
    run_cli,
    session_phase,
    steerflow_argv,
    wait_for,
    wait_stamped,
    write_yaml,
)

from steerflow import views
from steerflow.studio import csrf_token, is_loopback, listen

EVIL = "<img src=x onerror=alert(1)>"
GATED_CLI = Path(__file__).resolve().with_name("gated_cli.py")


@dataclass
class Studio:
    """A running studio and the URL (with token) it announced."""

    url: str

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    @property
    def token(self) -> str:
        return self.url.split("token=", 1)[1]

    @contextmanager
    def client(self) -> Iterator[httpx.Client]:
        """A client that has exchanged the token for the cookie, as a browser would."""
        with httpx.Client(base_url=self.base, timeout=30) as client:
            first = client.get(self.url.removeprefix(self.base))
            assert first.status_code == 303, first.text
            yield client


@contextmanager
def studio(home: Path) -> Iterator[Studio]:
    """A studio served by uvicorn on a thread of this process: real HTTP over loopback."""
    listening = listen(home, port=0)
    thread = threading.Thread(target=listening.run, name="studio", daemon=True)
    thread.start()
    try:
        wait_for(lambda: listening.server.started, timeout=30, what="the studio to start")
        yield Studio(listening.url)
    finally:
        listening.server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive()


@contextmanager
def studio_process(home: Path, *extra: str) -> Iterator[Studio]:
    """``steerflow studio --port 0`` as a subprocess, and the URL it printed."""
    out = home.parent / "studio.out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            steerflow_argv(home, "studio", "--port", "0", *extra),
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
    try:

        def announced() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"studio exited {proc.returncode}: {proc.stderr.read()}")
            match = re.search(r"steerflow studio: (http://\S+)", out.read_text())
            return match.group(1) if match else None

        yield Studio(wait_for(announced, timeout=30, what="the studio's URL"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()


def _plan(
    tmp_path: Path, script_dir: Path, script: dict[str, object], chain: str = "ab"
) -> list[str]:
    """A chain of nodes (``a -> b [-> c]``) on the script model."""
    plan: list[dict[str, object]] = []
    for i, key in enumerate(chain):
        entry: dict[str, object] = {"agent_id": key, "instruction": f"step {key}"}
        if i:
            entry["depends_on"] = [chain[i - 1]]
        plan.append(entry)
    write_yaml(tmp_path / "plan.yaml", {"name": "studio", "plan": plan})
    script_dir.mkdir(parents=True, exist_ok=True)
    path = write_yaml(script_dir / "script.yaml", script)
    return ["--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{path}"]


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert match, page
    return match.group(1)


def test_every_request_needs_the_token_then_the_cookie(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with studio_process(home) as s, httpx.Client(base_url=s.base, timeout=30) as bare:
        for path in ("/", "/runs", "/static/studio.css", "/nowhere"):
            refused = bare.get(path)
            assert refused.status_code == 401, path
            assert "content-security-policy" in refused.headers
        assert bare.get("/runs?token=" + "x" * 43).status_code == 401
        assert bare.post("/runs?token=" + s.token).status_code == 401  # only a GET exchanges

        # The token is exchanged for the cookie and removed from the URL; other
        # parameters survive the redirect.
        first = bare.get(f"/runs?status=failed&token={s.token}")
        assert first.status_code == 303
        assert first.headers["location"] == "/runs?status=failed"
        cookie = first.headers["set-cookie"]
        port = s.base.rsplit(":", 1)[1]  # each studio names its cookie by its port
        assert cookie.startswith(f"steerflow_studio_{port}={s.token};")
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Path=/" in cookie
        assert first.headers["referrer-policy"] == "no-referrer"

        sneaky = bare.get(f"{s.base}//evil.example/x?token={s.token}")
        assert sneaky.status_code == 303 and sneaky.headers["location"] == "/"
        page = bare.get("/runs?status=failed")  # the client now holds the cookie
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "unsafe-inline" not in csp
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        assert "no runs with status failed" in page.text
        # The one script is the studio's own file: nothing inline.
        assert re.findall(r"<script[^>]*>", page.text) == ['<script src="/static/studio.js" defer>']
        css = bare.get("/static/studio.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")

        # A page of another site that rebinds its name to 127.0.0.1 sends its own Host.
        rebound = bare.get("/runs", headers={"host": "evil.example:80"})
        assert rebound.status_code == 400
        wrong = httpx.get(s.base + "/runs", cookies={f"steerflow_studio_{port}": "x"}, timeout=30)
        assert wrong.status_code == 401


def test_runs_page_lists_newest_first_escapes_and_filters(tmp_path: Path) -> None:
    home = tmp_path / "home"
    evil_dir = tmp_path / EVIL  # the model spec names this path: outside text on the page
    ok = run_cli(home, "flow", *_plan(tmp_path, evil_dir, {}), "--json")
    assert ok.returncode == 0, ok.stderr
    bad = run_cli(home, "flow", *_plan(tmp_path, evil_dir, {"b": {"fail": "<b>boom</b>"}}))
    assert bad.returncode == 1, bad.stderr
    runs = [r["run_id"] for r in ctl_runs(home)]
    with studio(home) as s, s.client() as client:
        page = client.get("/runs").text
        assert page.index(f'id="run-{runs[0]}"') < page.index(f'id="run-{runs[1]}"')
        assert EVIL not in page and "<img" not in page
        assert "script:" + str(tmp_path / "&lt;img src=x onerror=alert(1)&gt;") in page
        assert ">2/2<" in page and "status-failed" in page and "status-completed" in page

        assert 'data-live="/api/runs" data-live-kind="runs"' in page
        live = client.get("/api/runs")
        rows = live.json()["runs"]
        assert [(r["run_id"], r["status"], r["progress"]) for r in rows] == [
            (runs[0], "failed", "2/2 (1 failed)"), (runs[1], "completed", "2/2")
        ]  # fmt: skip
        unchanged = client.get("/api/runs", headers={"if-none-match": live.headers["etag"]})
        assert unchanged.status_code == 304
        assert client.get("/api/runs?status=failed").json()["runs"] == rows[:1]
        third = run_cli(home, "flow", *_plan(tmp_path, evil_dir, {}), "--json")
        assert third.returncode == 0, third.stderr
        changed = client.get("/api/runs", headers={"if-none-match": live.headers["etag"]})
        assert changed.status_code == 200 and len(changed.json()["runs"]) == 3

        failed = client.get("/runs", params={"status": "failed"}).text
        assert f'id="run-{runs[0]}"' in failed and f'id="run-{runs[1]}"' not in failed
        # An unknown filter is ignored, never echoed.
        odd = client.get("/runs", params={"status": "<script>x</script>"}).text
        assert "<script>" not in odd and f'id="run-{runs[1]}"' in odd


def ctl_runs(home: Path) -> list[dict[str, object]]:
    import json

    listing = run_cli(home, "runs", "--json")
    assert listing.returncode == 0, listing.stderr
    runs: list[dict[str, object]] = json.loads(listing.stdout)["runs"]
    return runs


def test_run_and_node_pages_agree_with_show_and_stay_inert(tmp_path: Path) -> None:
    home = tmp_path / "home"
    xss = '<script>alert(1)</script><img src=x onerror=alert(2)><a href="javascript:alert(3)">'
    script = {"a": {"spawn": [{"agent_id": "s1", "instruction": "fix it"}]},
              "b": {"response": xss}}  # fmt: skip
    done = run_cli(home, "flow", *_plan(tmp_path, tmp_path / "s", script, chain="abc"),
                   "--reactive", "all", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["run_id"]
    shown = json.loads(run_cli(home, "show", run, "--json").stdout)
    graph = views.run_graph(home, run)
    assert [(n.id, n.kind, n.layer, n.depends_on, n.parent) for n in graph.nodes] == [
        ("a", "planned", 0, (), None),
        ("b", "planned", 1, ("a",), None),
        ("c", "planned", 2, ("b",), None),
        ("s1", "spawned", 1, ("a",), "a"),  # drawn below the node that spawned it
    ]  # fmt: skip
    with studio(home) as s, s.client() as client:
        page = client.get(f"/runs/{run}")
        assert page.status_code == 200
        assert '<script src="/static/studio.js" defer></script>' in page.text
        assert f'data-live="/api/runs/{run}"' in page.text
        for node in shown["nodes"]:  # the page shows what `show --json` says
            key, status = node["id"], node["status"]
            assert f'<td data-node-status="{key}">{status}</td>' in page.text
            kind = node["kind"]
            assert f'class="node status-{status} kind-{kind}" data-node="{key}"' in page.text
        assert [n["id"] for n in shown["nodes"]] == ["a", "b", "c", "s1"]
        assert page.text.count("<polyline ") == 3 and page.text.count('"edge spawn-edge"') == 1
        assert 'id="recovery"' not in page.text  # a completed run has nothing to recover
        api = client.get(f"/api/runs/{run}")
        # show --json plus the control count the page's control log follows.
        assert api.json() == {**shown, "control_count": 0}
        # Nothing changed: the page's poll is answered 304 without a new read.
        again = client.get(f"/api/runs/{run}", headers={"if-none-match": api.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        js = client.get("/static/studio.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        assert "innerHTML" not in js.text and "textContent" in js.text

        node_page = client.get(f"/runs/{run}/nodes/b").text
        assert "<script>" not in node_page and "<img" not in node_page
        assert '<a href="javascript' not in node_page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in node_page
        assert f'<a href="/runs/{run}/nodes/a">a</a>' in node_page  # depends on
        for path in (f"/runs/{run}/nodes/zz", "/runs/19990101T000000-abcdef", "/runs/%3Cscript%3E"):
            missing = client.get(path)
            assert missing.status_code == 404, path
            assert "<script" not in missing.text


def test_controls_need_csrf_steer_a_live_flow_and_resume_it_after_stop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = _plan(tmp_path, tmp_path / "s", {}, chain="abc")
    # a and b are held (gated_cli.py) until the test released them: each control lands
    # while its node is in flight however slow the machine, with no duration guessed.
    home.mkdir(mode=0o700)
    for key in "ab":
        (home / f"gate-{key}").touch()
    argv = [sys.executable, str(GATED_CLI), "--home", str(home), "flow", *args, "--json"]
    with live_flow(home, args, argv=argv) as flow, studio(home) as s, s.client() as client:
        sid, run = flow.session_id, flow.run_id
        flow.wait_nodes(lambda st: st.get("a") == "running", what="a running")
        page = client.get("/runs").text
        csrf = _csrf(page)
        assert csrf == csrf_token(s.token)
        action = f"/sessions/{sid}/control"
        assert f'action="{action}"' in page

        # Without the CSRF token, with a wrong one, or without the cookie: refused, no row.
        assert client.post(action, data={"verb": "pause"}).status_code == 403
        assert client.post(action, data={"verb": "pause", "csrf": "0" * 64}).status_code == 403
        cookieless = httpx.post(s.base + action, data={"verb": "pause", "csrf": csrf}, timeout=30)
        assert cookieless.status_code == 401
        assert count_controls(home) == 0

        # Pause from the Run page: the flow holds its next node.
        run_page = client.get(f"/runs/{run}").text
        before = client.get(f"/api/runs/{run}").headers["etag"]
        assert f'action="{action}"' in run_page
        paused = client.post(action, data={"verb": "pause", "csrf": csrf, "back": f"/runs/{run}"})
        assert paused.status_code == 303
        assert paused.headers["location"].startswith(f"/runs/{run}?queued=")
        control_id = re.search(r"queued=([0-9a-f]{32})", paused.headers["location"])
        assert control_id, paused.headers["location"]
        assert wait_stamped(home, control_id.group(1), alive=flow.proc).result == "applied"
        assert session_phase(home, sid) == "paused"
        (home / "release-a").touch()
        flow.wait_nodes(
            lambda st: st["a"] == "completed" and st["b"] == "paused", what="b held at the gate"
        )
        # The live poll sees the change although the page sends its old tag.
        polled = client.get(f"/api/runs/{run}", headers={"if-none-match": before})
        assert polled.status_code == 200 and polled.json()["phase"] == "paused"
        notice = client.get(paused.headers["location"]).text
        assert f"queued control {control_id.group(1)}" in notice
        assert f"<td><code>{control_id.group(1)}</code></td><td>pause</td>" in notice
        # A redirect target outside the studio is ignored.
        off_site = client.post(action, data={"verb": "pause", "csrf": csrf,
                                             "back": "https://evil.example/"})  # fmt: skip
        assert off_site.headers["location"].startswith("/runs?queued=")

        # A message, escaped wherever the studio shows it back, reaches the next node.
        empty = client.post(action, data={"verb": "message", "text": "", "csrf": csrf})
        assert empty.status_code == 400 and "<script" not in empty.text
        sent = client.post(action, data={"verb": "message", "text": "<script>x</script>",
                                         "csrf": csrf})  # fmt: skip
        assert sent.status_code == 303
        released = client.post(action, data={"verb": "resume", "csrf": csrf})
        assert released.status_code == 303
        flow.wait_nodes(lambda st: st["b"] == "running", what="b released")
        node = client.get(f"/runs/{run}/nodes/b").text
        assert '<mark class="steer">[OPERATOR STEER]' in node
        assert "&lt;script&gt;x&lt;/script&gt;" in node and "<script>x" not in node

        for bad in ("lots", "0", "nan"):  # the ctl budget refusals, as a 400
            refused = client.post(action, data={"verb": "budget", "max_cost": bad, "csrf": csrf})
            assert refused.status_code == 400 and "--max-cost" in refused.text, bad
        # The script model has no price: a cost cap the run recorded it cannot enforce is
        # refused when sent, with the run's reason, and queues nothing (decision 246).
        queued = count_controls(home)
        capped = client.post(action, data={"verb": "budget", "max_cost": "5", "csrf": csrf})
        assert capped.status_code == 409, capped.text
        assert "no price is known for model &#x27;script:" in capped.text, capped.text
        assert count_controls(home) == queued

        stopped = client.post(action, data={"verb": "stop", "csrf": csrf})
        assert stopped.status_code == 303
        stop_id = re.search(r"queued=([0-9a-f]{32})", stopped.headers["location"])
        assert stop_id, stopped.headers["location"]
        assert wait_stamped(home, stop_id.group(1), alive=flow.proc).result == "applied"
        (home / "release-b").touch()  # graceful: the in-flight b finishes, c never starts
        assert flow.finish() == 75
        verbs = [c["verb"] for c in ctl_status(home, sid)["controls"]]
        assert verbs == ["pause", "pause", "message", "resume", "stop"]
        # The session no longer runs: the writer refuses, and the page says so (409).
        late = client.post(action, data={"verb": "pause", "csrf": csrf})
        assert late.status_code == 409 and "not running" in late.text

        # Recovery: the stopped run's preflight is `resume --dry-run`'s, and Resume runs it.
        page = client.get(f"/runs/{run}").text
        assert 'id="recovery"' in page
        assert "would replay 2: a, b; would run 1: c" in page
        dry = run_cli(home, "resume", run, "--dry-run", "--json")
        assert [n["status"] for n in json.loads(dry.stdout)["nodes"]] == [
            "completed",
            "completed",
            "pending",
        ]
        assert client.post(f"/runs/{run}/resume", data={}).status_code == 403
        started = client.post(f"/runs/{run}/resume", data={"csrf": csrf})
        assert started.status_code == 303
        assert started.headers["location"].startswith(f"/runs/{run}?resumed=")

        def resumed() -> dict[str, object] | None:
            by = [r for r in ctl_runs(home) if r.get("resumed_from_run") == run]
            return by[0] if by and by[0]["status"] == "completed" else None

        new = wait_for(resumed, timeout=60, what="the resumed run to complete")
        page = client.get(f"/runs/{run}").text
        assert f'resumed by <a href="/runs/{new["run_id"]}">' in page


def test_a_non_loopback_host_is_refused_without_allow_remote(tmp_path: Path) -> None:
    proc = run_cli(tmp_path / "home", "studio", "--host", "0.0.0.0", "--port", "0")
    assert proc.returncode == 2, proc.stderr
    assert "--allow-remote" in proc.stderr and proc.stdout == ""
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.8.9.10") and is_loopback("[::1]")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.com") and not is_loopback("::")


def test_without_the_extra_studio_names_the_install_and_exits_2(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "starlette"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'starlette'\", name='starlette')\n",
        encoding="utf-8",
    )
    proc = run_cli(tmp_path / "home", "studio", env={"PYTHONPATH": str(tmp_path / "shadow")})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'steerflow[studio]'" in lines[0], proc.stderr
    assert proc.stdout == ""


def test_artifact_downloads_stay_in_the_leg_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    page = "<script>alert(1)</script>"
    write_yaml(
        tmp_path / "plan.yaml",
        {"name": "art", "plan": [{"agent_id": "a", "instruction": "write",
                                  "artifacts": ["out/page.html"]}]},
    )  # fmt: skip
    script = write_yaml(tmp_path / "s.yaml", {"a": {"artifacts": {"out/page.html": page}}})
    done = run_cli(home, "flow", "--plan", str(tmp_path / "plan.yaml"),
                   "--model", f"script:{script}", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    run, run_dir = result["run_id"], Path(result["run_dir"])
    with studio(home) as s, s.client() as client:
        node = client.get(f"/runs/{run}/nodes/a").text
        href = f"/runs/{run}/nodes/a/artifacts/out/page.html"
        assert f'<a href="{href}">out/page.html</a>' in node
        got = client.get(href)
        assert got.status_code == 200 and got.content == page.encode()
        # Data, never a page of the studio's origin.
        assert got.headers["content-type"] == "application/octet-stream"
        assert got.headers["content-disposition"].startswith("attachment;")
        assert got.headers["x-steerflow-recorded-digest"].startswith("blake2b:")
        # Only what the node recorded, and only inside its leg directory.
        secret = tmp_path / "secret.txt"
        secret.write_text("not an artifact", encoding="utf-8")
        for path in ("out/other.html", "out/../../../secret.txt", "%2E%2E/secret.txt"):
            refused = client.get(f"/runs/{run}/nodes/a/artifacts/{path}")
            assert refused.status_code == 404, path
        leg = run_dir / "artifacts" / "a" / "out" / "page.html"
        leg.unlink()
        leg.symlink_to(secret)  # the recorded name now points outside: not followed
        swapped = client.get(href)
        assert swapped.status_code == 409 and b"not an artifact" not in swapped.content
