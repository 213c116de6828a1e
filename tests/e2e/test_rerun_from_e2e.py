"""End to end: ``steerflow resume RUN --from NODE`` pays for exactly the nodes it names.

A real ``steerflow flow --plan`` subprocess against the loopback OpenAI-shaped server of
the provider tests (``tests/providers/llm_fakes.py``), which counts every request; each
node's instruction carries ``NODE-<id>``, so the server side knows which node each call
was for. Then ``resume --from b --instruction TEXT``: the server sees b and what is
downstream of it again, nothing upstream; the dry run named exactly those; the new run's
``show RUN b --json`` reports the edit.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from flow_support import CliResult, child_env, run_cli, write_yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "providers"))
from llm_fakes import FakeLLMServer, Reply

_VENDOR_ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
EDITED = "Task NODE-b, answered in French."


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    fake = FakeLLMServer("openai").start()
    fake.forever(Reply(text="done", input_tokens=100, output_tokens=50))
    try:
        yield fake
    finally:
        fake.close()


def _env(server: FakeLLMServer) -> dict[str, str]:
    env = {
        k: v
        for k, v in child_env().items()
        if k not in _VENDOR_ENV and not k.startswith("STEERFLOW_")
    }
    env.update({"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-rerun"})
    env.update({"NO_PROXY": "127.0.0.1,localhost", "STEERFLOW_PROVIDER_MAX_ATTEMPTS": "1"})
    return env


def _cli(server: FakeLLMServer, home: Path, *args: object) -> CliResult:
    return run_cli(home, *args, env=_env(server), timeout=120)


def _asked(server: FakeLLMServer) -> Counter[str]:
    """How many requests arrived for each node (``NODE-<id>`` of its own instruction)."""
    found: Counter[str] = Counter()
    for body in server.bodies():
        match = re.search(r"NODE-(\w+)", server.user_text(body))
        assert match is not None, server.user_text(body)
        found[match.group(1)] += 1
    return found


def _diamond(path: Path) -> Path:
    """a -> b -> d, a -> c -> d, e alone, and a synthesis over every worker."""
    return write_yaml(
        path,
        {
            "synthesis": {"instruction": "Combine NODE-synthesis."},
            "plan": [
                {"agent_id": "a", "instruction": "Task NODE-a."},
                {"agent_id": "b", "instruction": "Task NODE-b.", "depends_on": ["a"]},
                {"agent_id": "c", "instruction": "Task NODE-c.", "depends_on": ["a"]},
                {"agent_id": "d", "instruction": "Task NODE-d.", "depends_on": ["b", "c"]},
                {"agent_id": "e", "instruction": "Task NODE-e."},
            ],
        },
    )


def test_rerun_from_b_pays_for_exactly_b_and_what_is_downstream(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    home = tmp_path / "home"
    plan = _diamond(tmp_path / "plan.yaml")
    first = _cli(server, home, "flow", "--plan", plan, "--model", "openai/test-model", "--json")
    assert first.returncode == 0, first.stderr
    source = first.json["run_id"]
    assert _asked(server) == Counter({k: 1 for k in ("a", "b", "c", "d", "e", "synthesis")})

    dry = _cli(server, home, "resume", source, "--from", "b", "--instruction", EDITED,
               "--dry-run", "--json")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    named = dry.json["rerun"]
    assert named == ["b", "d", "synthesis"]
    assert dry.json["rerun_from"]["instruction_edited"]["instruction"] == EDITED
    line = "rerun from b (with the edited instruction): 3 nodes will run again and be paid for"
    assert f"{line}: b, d, synthesis" in dry.stderr
    assert sum(_asked(server).values()) == 6  # a dry run pays for nothing

    rerun = _cli(server, home, "resume", source, "--from", "b", "--instruction", EDITED, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert f"{line}: b, d, synthesis" in rerun.stderr
    out = rerun.json
    assert out["run_id"] != source and out["status"] == "completed"
    assert out["rerun"] == named
    again = _asked(server) - Counter({k: 1 for k in ("a", "b", "c", "d", "e", "synthesis")})
    assert again == Counter(dict.fromkeys(named, 1))  # exactly the named, each once
    # The request for b carried the edited instruction, and no other one did.
    texts = [server.user_text(b) for b in server.bodies()]
    carried = [t for t in texts if "answered in French" in t]
    assert len(carried) == 1 and carried[0].startswith(EDITED)
    statuses = {n["id"]: n["status"] for n in out["nodes"]}
    assert set(statuses.values()) == {"completed"}

    shown = _cli(server, home, "show", out["run_id"], "b", "--json")
    assert shown.returncode == 0, shown.stderr
    edit = shown.json["instruction_edited"]
    assert edit == {"original": "Task NODE-b.", "instruction": EDITED, "run_id": source}
    assert shown.json["instruction"].startswith(EDITED)
    upstream = _cli(server, home, "show", out["run_id"], "a", "--json").json
    assert upstream["replayed"] is True and upstream["instruction_edited"] is None
    text = _cli(server, home, "show", out["run_id"], "b")
    assert "instruction: edited" in text.stdout and "original: Task NODE-b." in text.stdout

    # The source is unchanged: a plain resume of it still has nothing to run.
    source_show = _cli(server, home, "show", source, "b", "--json").json
    assert source_show["instruction_edited"] is None


def test_rerun_refusals_exit_2_before_anything_is_paid(
    tmp_path: Path, server: FakeLLMServer
) -> None:
    home = tmp_path / "home"
    plan = _diamond(tmp_path / "plan.yaml")
    first = _cli(server, home, "flow", "--plan", plan, "--model", "openai/test-model", "--json")
    assert first.returncode == 0, first.stderr
    source = first.json["run_id"]
    paid = sum(_asked(server).values())

    unknown = _cli(server, home, "resume", source, "--from", "bb")
    assert unknown.returncode == 2, unknown.stderr
    assert "a, b, c, d, e, synthesis" in unknown.stderr and "did you mean b" in unknown.stderr
    alone = _cli(server, home, "resume", source, "--instruction", "x")
    assert alone.returncode == 2 and "--from" in alone.stderr
    assert sum(_asked(server).values()) == paid
