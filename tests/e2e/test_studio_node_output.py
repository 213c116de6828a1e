"""The node page keeps what a node streamed (issue 32 item 5, with issue 31's live files).

While the node runs, the page is rendered with the text its live files hold so far and
the position the script goes on from, so a reload loses nothing and repeats nothing.
Once it ended (the page reloads on the node's new status), the streamed text stays on
the page beside the recorded response, server-rendered and escaped. Real HTTP to a real
Studio; the finished run is a real ``steerflow flow`` subprocess.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ctl_support import run_cli, write_yaml
from test_studio_e2e import studio

from steerflow.state import NodeUpdate, StateDB

RUN = "20260101T000000-0d0d0d"
CHUNKS = ["first line\n", "<b>not bold</b> & more\n", "last line\n"]


def _section(page: str, section_id: str) -> str:
    match = re.search(rf'<section id="{section_id}"[^>]*>.*?</section>', page, re.S)
    assert match, page
    return match.group(0)


def test_running_node_page_renders_the_stream_so_far_and_goes_on_from_there(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    live = home / "runs" / RUN / "live" / "s"
    live.mkdir(parents=True, mode=0o700)
    (live / "0.txt").write_text(CHUNKS[0] + CHUNKS[1])
    so_far = len((CHUNKS[0] + CHUNKS[1]).encode())
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=RUN, phase="executing")
        db.upsert_nodes(row.id, [NodeUpdate("s", "planned", "running")])
    with studio(home) as s, s.client() as client:
        page = client.get(f"/runs/{RUN}/nodes/s").text
        section = _section(page, "live-output")
        assert f'data-segment="0" data-offset="{so_far}"' in section
        assert "first line\n&lt;b&gt;not bold&lt;/b&gt; &amp; more\n</pre>" in section
        assert "<b>" not in section and 'id="live-kept"' not in page
        assert "<script>" not in page  # the script is /static/node-live.js, never inline
        script = client.get("/static/node-live.js").text
        assert 'output.getAttribute("data-offset")' in script
        # From the rendered position the output API answers only what came after.
        api = f"/api/runs/{RUN}/nodes/s/output"
        rest = client.get(api, params={"segment": 0, "offset": so_far}).json()
        assert (rest["text"], rest["done"]) == ("", False)
        with open(live / "0.txt", "a") as handle:
            handle.write(CHUNKS[2])
        rest = client.get(api, params={"segment": 0, "offset": so_far}).json()
        assert rest["text"] == CHUNKS[2]
        # A reload renders it all, and the position moves on with it.
        again = _section(client.get(f"/runs/{RUN}/nodes/s").text, "live-output")
        assert f'data-offset="{len("".join(CHUNKS).encode())}"' in again
        assert "last line\n</pre>" in again


def test_completed_node_page_keeps_the_streamed_output_beside_the_response(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    write_yaml(
        tmp_path / "plan.yaml", {"name": "live", "plan": [{"agent_id": "s", "instruction": "go"}]}
    )
    script = write_yaml(tmp_path / "script.yaml", {"s": {"stream": CHUNKS, "response": "done"}})
    done = run_cli(
        home, "flow", "--plan", str(tmp_path / "plan.yaml"), "--model", f"script:{script}",
        "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["run_id"]
    with studio(home) as s, s.client() as client:
        page = client.get(f"/runs/{run}/nodes/s").text
        assert '<pre class="response">done</pre>' in page
        kept = _section(page, "live-kept")
        assert "<h3>live output as streamed</h3>" in kept
        assert (
            '<pre id="live-kept-text" class="live">first line\n&lt;b&gt;not bold&lt;/b&gt;'
            " &amp; more\nlast line\n</pre>"
        ) in kept
        # Kept, not polled: no live section for the script to stream into.
        assert 'id="live-output"' not in page
        assert page.index('class="response"') < page.index('id="live-kept"')
        output = client.get(f"/api/runs/{run}/nodes/s/output").json()
        assert (output["text"], output["done"]) == ("".join(CHUNKS), True)


def test_a_node_that_streamed_nothing_shows_no_kept_section(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "runs" / RUN).mkdir(parents=True, mode=0o700)
    with StateDB.open(home) as db:
        row = db.create_session(kind="flow", run_id=RUN, phase="executing")
        db.upsert_nodes(row.id, [NodeUpdate("s", "planned", "completed")])
        db.set_session_status(row.id, "completed")
    with studio(home) as s, s.client() as client:
        page = client.get(f"/runs/{RUN}/nodes/s")
        assert page.status_code == 200
        assert 'id="live-kept"' not in page.text and 'id="live-output"' not in page.text
