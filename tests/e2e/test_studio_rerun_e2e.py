"""The Studio's "Rerun from here" (issue 40 item 6), over real HTTP on loopback.

The node page carries the form (its planned instruction in a textarea); its GET shows the
fork's ``resume --from NODE --dry-run`` (what runs again and is paid); only that page's
POST, with the CSRF token, starts ``steerflow resume RUN --from NODE --instruction TEXT``
as a real subprocess, the way the Studio starts every resume.
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

from ctl_support import run_cli, wait_for, write_yaml
from test_studio_e2e import ctl_runs, studio

EDITED = 'Do b, "in French" <now>.\nKeep it short.'


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert match, page
    return match.group(1)


def _first_run(tmp_path: Path, home: Path) -> str:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "name": "diamond",
            "synthesis": {"instruction": "Combine."},
            "plan": [
                {"agent_id": "a", "instruction": "Do a."},
                {"agent_id": "b", "instruction": "Do b.", "depends_on": ["a"]},
                {"agent_id": "c", "instruction": "Do c.", "depends_on": ["a"]},
                {"agent_id": "d", "instruction": "Do d.", "depends_on": ["b", "c"]},
            ],
        },
    )
    first = run_cli(home, "flow", "--plan", plan, "--model", "echo", "--json")
    assert first.returncode == 0, first.stderr
    return str(json.loads(first.stdout)["run_id"])


def test_rerun_from_here_confirms_with_the_dry_run_then_starts_the_fork(tmp_path: Path) -> None:
    home = tmp_path / "home"
    source = _first_run(tmp_path, home)
    with studio(home) as s, s.client() as client:
        node = client.get(f"/runs/{source}/nodes/b").text
        form = re.search(r'<form method="get" id="rerun-from" action="([^"]+)">', node)
        assert form is not None and form.group(1) == f"/runs/{source}/rerun"
        assert '<textarea name="instruction" rows="4" cols="80">Do b.</textarea>' in node
        # A spawned node or an unknown id gets no page to start from.
        assert client.get(f"/runs/{source}/rerun", params={"node": "../x"}).status_code == 404

        # Unchanged text is no edit: the dry run of a plain --from b.
        plain = client.get(
            f"/runs/{source}/rerun",
            params={"node": "b", "instruction": "Do b.", "original": "Do b."},
        ).text
        assert 'id="rerun-instruction"' not in plain
        assert "runs again, paid (3)</strong>: b, d, synthesis" in plain

        confirm = client.get(
            f"/runs/{source}/rerun",
            params={"node": "b", "instruction": EDITED.replace("\n", "\r\n"), "original": "Do b."},
        ).text
        assert "runs again, paid (3)</strong>: b, d, synthesis" in confirm
        assert "replayed from the checkpoint, not paid again (2): a, c" in confirm
        assert EDITED not in confirm  # escaped, never markup
        shown = re.search(r'<pre id="rerun-instruction">(.*?)</pre>', confirm, re.S)
        assert shown is not None and unescape(shown.group(1)) == EDITED
        hidden = re.search(r'name="instruction" value="([^"]*)"', confirm)
        assert hidden is not None and unescape(hidden.group(1)) == EDITED
        csrf = _csrf(confirm)
        assert ctl_runs(home)[0]["run_id"] == source  # a dry run creates no run

        # As a browser submits it: line breaks as CRLF.
        data = {"node": "b", "instruction": EDITED.replace("\n", "\r\n")}
        assert client.post(f"/runs/{source}/rerun", data=data).status_code == 403
        started = client.post(f"/runs/{source}/rerun", data={**data, "csrf": csrf})
        assert started.status_code == 303, started.text
        assert started.headers["location"].startswith(f"/runs/{source}?resumed=")

        def forked() -> dict[str, object] | None:
            by = [r for r in ctl_runs(home) if r.get("resumed_from_run") == source]
            return by[0] if by and by[0]["status"] == "completed" else None

        new = str(wait_for(forked, timeout=60, what="the rerun to complete")["run_id"])
        detail = run_cli(home, "show", new, "b", "--json")
        assert detail.returncode == 0, detail.stderr
        edit = json.loads(detail.stdout)["instruction_edited"]
        assert edit == {"original": "Do b.", "instruction": EDITED, "run_id": source}
        # The fork's node page says so, and offers its own rerun from the edited text.
        page = client.get(f"/runs/{new}/nodes/b").text
        assert 'id="instruction-edited"' in page and "<code>Do b.</code>" in page
        upstream = json.loads(run_cli(home, "show", new, "a", "--json").stdout)
        assert upstream["replayed"] is True
