"""The offline ``echo`` model and the ``script:PATH`` model (CONTRACT §4)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from steerflow.errors import ProviderError, UnsafePathError, UsageError
from steerflow.plan import parse_plan
from steerflow.providers import (
    INVOCATION_LOG,
    EchoProvider,
    PlanRequest,
    ProviderRequest,
    ScriptProvider,
    echo_text,
    load_script,
    make_provider,
)

pytestmark = pytest.mark.timeout(60)


def request(
    home: Path, key: str = "node", instruction: str = "do it", *, run_id: str = "run-1", **kw: Any
) -> ProviderRequest:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "node_key": key,
        "node_id": "0" * 32,
        "kind": "planned",
        "assignee": None,
        "instruction": instruction,
        "history": (),
        "artifact_dir": home / "artifacts" / key,
        "home": home,
    }
    fields.update(kw)
    return ProviderRequest(**fields)


def script_file(tmp_path: Path, data: object, name: str = "script.yaml") -> Path:
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(json.dumps(data))
    else:
        path.write_text(yaml.safe_dump(data))
    return path


def invocations(home: Path) -> list[dict[str, Any]]:
    log = home / INVOCATION_LOG
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def cli(home: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "steerflow", "--home", str(home), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


# -- echo ----------------------------------------------------------------------------------------


async def test_echo_returns_node_id_and_full_instruction_verbatim(home: Path) -> None:
    instruction = (
        "[OPERATOR STEER]\nwhy\n- 2026-01-01T00:00:00.000Z: be terse\n[/OPERATOR STEER]\n\nGo"
    )
    response = await EchoProvider().invoke(request(home, "draft-1", instruction))
    assert "draft-1" in response.text
    assert instruction in response.text
    assert response.text == echo_text(request(home, "draft-1", instruction))
    assert response.spawns == []


async def test_echo_is_deterministic(home: Path) -> None:
    first = await EchoProvider().invoke(request(home))
    second = await EchoProvider().invoke(request(home, run_id="other"))
    assert first.text == second.text


async def test_echo_delay_waits(home: Path) -> None:
    provider = make_provider("echo:delay=0.2")
    assert isinstance(provider, EchoProvider) and provider.delay == 0.2
    started = time.monotonic()
    await provider.invoke(request(home))
    assert time.monotonic() - started >= 0.19


@pytest.mark.parametrize(
    "spec", ["echo:delay=abc", "echo:delay=-1", "echo:delay=nan", "echo:speed=2", "echo:delay"]
)
def test_bad_echo_options(spec: str) -> None:
    with pytest.raises(UsageError):
        make_provider(spec)


@pytest.mark.parametrize("spec", ["", "nope", "gpt-4", "openai/", "/model"])
def test_unknown_model_spec(spec: str) -> None:
    with pytest.raises(UsageError):
        make_provider(spec)


async def test_echo_plan_is_a_valid_deterministic_plan() -> None:
    req = PlanRequest(prompt="fix   the\nbug", schema={}, max_entries=200)
    raw = await EchoProvider().plan(req)
    assert raw == await EchoProvider().plan(req)
    plan = parse_plan(raw, source="echo")
    assert len(plan.plan) >= 2
    assert any("fix the bug" in e.instruction for e in plan.plan)


# -- script: the file ----------------------------------------------------------------------------


def test_contract_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(
        '"*":            {delay: 0.0}\n'
        'research:       {response: "notes", delay: 1.5}\n'
        'draft:          {fail: "provider error text"}\n'
        'review:         {spawn: [{agent_id: fix-1, assignee: coder, instruction: "fix it"}]}\n'
        'build:          {artifacts: {"out/report.md": "content"}}\n'
        'flaky:          {fail_once: "first time fails"}\n'
    )
    scripts = load_script(path)
    assert set(scripts) == {"*", "research", "draft", "review", "build", "flaky"}
    assert scripts["research"].response == "notes" and scripts["research"].delay == 1.5
    assert scripts["draft"].fail == "provider error text"
    assert scripts["build"].artifacts == {"out/report.md": "content"}
    assert scripts["flaky"].fail_once == "first time fails"


@pytest.mark.parametrize(
    "data",
    [
        {"a": {"respnse": "typo"}},
        {"*": {"delay": 0, "retries": 3}},
        {"a": {"spawn": [], "extra": 1}},
    ],
)
def test_unknown_key_is_a_usage_error(tmp_path: Path, data: dict[str, Any]) -> None:
    with pytest.raises(UsageError) as info:
        ScriptProvider(f"script:{script_file(tmp_path, data)}")
    assert info.value.exit_code == 2
    assert "unknown key" in str(info.value)


@pytest.mark.parametrize(
    "text", ["- a\n- list\n", "a: {delay: -1}\n", "a: {delay: [1]}\n", "a: [unclosed\n"]
)
def test_invalid_script_is_a_usage_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError):
        ScriptProvider(f"script:{path}")


def test_an_alias_bomb_is_refused_before_anything_expands_it(tmp_path: Path) -> None:
    # Seven levels of nine aliases: 9**7 (4.8 million) strings behind a few lines; encoding
    # the response used to take tens of seconds and gigabytes before the node even ran.
    levels = ['&a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdef", "bcdefg", strict=True):
        levels.append(f"&{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    path = tmp_path / "bomb.yaml"
    path.write_text('"*":\n  response: [' + ", ".join(levels) + "]\n")
    with pytest.raises(UsageError, match=r"expands to more than 1,000,000 values"):
        load_script(path)


def test_a_large_plain_response_is_still_accepted(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"*": {"response": [{"k": i} for i in range(100_000)]}}))
    assert len(load_script(path)["*"].response) == 100_000


def test_missing_script_or_path(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        make_provider(f"script:{tmp_path / 'absent.yaml'}")
    with pytest.raises(UsageError):
        make_provider("script:")


def test_empty_script_means_echo_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert ScriptProvider(f"script:{path}").scripts == {}


# -- script: behaviour ---------------------------------------------------------------------------


async def test_response_and_default_echo(tmp_path: Path, home: Path) -> None:
    data = {"a": {"response": "notes"}, "b": {"response": {"k": [1]}}}
    provider = make_provider(f"script:{script_file(tmp_path, data, 'script.json')}")
    assert (await provider.invoke(request(home, "a"))).text == "notes"
    assert json.loads((await provider.invoke(request(home, "b"))).text) == {"k": [1]}
    other = request(home, "unscripted", "instr")
    assert (await provider.invoke(other)).text == echo_text(other)


async def test_delay_with_star_defaults(tmp_path: Path, home: Path) -> None:
    path = script_file(tmp_path, {"*": {"delay": 1.0, "response": "dflt"}, "fast": {"delay": 0}})
    provider = make_provider(f"script:{path}")
    started = time.monotonic()
    slow_call = asyncio.ensure_future(provider.invoke(request(home, "slow")))
    fast = await provider.invoke(request(home, "fast"))
    # Both calls run at once and "fast" is answered while "slow" still sleeps the default
    # second, so "fast" did not take it (only its thread-pool log append had to fit in it).
    assert not slow_call.done()
    assert fast.text == "dflt"  # the node's own keys override, the rest come from "*"
    slow = await slow_call
    assert time.monotonic() - started >= 0.99
    assert slow.text == "dflt"


async def test_fail(tmp_path: Path, home: Path) -> None:
    provider = make_provider(f"script:{script_file(tmp_path, {'x': {'fail': 'boom text'}})}")
    for _ in range(2):
        with pytest.raises(ProviderError, match=r"^boom text$"):
            await provider.invoke(request(home, "x"))
    assert [line["node"] for line in invocations(home)] == ["x", "x"]


async def test_fail_once_per_home(tmp_path: Path) -> None:
    path = script_file(tmp_path, {"flaky": {"fail_once": "first try fails", "response": "ok"}})
    provider = make_provider(f"script:{path}")
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    home_a.mkdir(mode=0o700)
    home_b.mkdir(mode=0o700)
    with pytest.raises(ProviderError, match="first try fails"):
        await provider.invoke(request(home_a, "flaky"))
    assert (await provider.invoke(request(home_a, "flaky"))).text == "ok"
    assert (await provider.invoke(request(home_a, "flaky"))).text == "ok"
    # another node, and another home, each get their own first failure
    with pytest.raises(ProviderError):
        await provider.invoke(request(home_b, "flaky"))
    fresh = make_provider(f"script:{path}")  # a new provider (new process) remembers via the home
    assert (await fresh.invoke(request(home_a, "flaky"))).text == "ok"


def test_fail_once_across_processes(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"plan": [{"agent_id": "flaky", "instruction": "x"}]}))
    path = script_file(tmp_path, {"flaky": {"fail_once": "transient"}})
    home = tmp_path / "home"
    args = ("flow", "--plan", plan, "--model", f"script:{path}", "--json")
    first = cli(home, *args)
    assert first.returncode == 1, first.stderr
    assert json.loads(first.stdout)["nodes"][0]["status"] == "failed"
    second = cli(home, *args)
    assert second.returncode == 0, second.stderr
    log = invocations(home)
    assert [line["node"] for line in log] == ["flaky", "flaky"]
    assert [line["run_id"] for line in log] == [
        json.loads(first.stdout)["run_id"],
        json.loads(second.stdout)["run_id"],
    ]
    other = cli(tmp_path / "other-home", *args)
    assert other.returncode == 1, other.stderr


async def test_spawn_requests_are_returned_raw(tmp_path: Path, home: Path) -> None:
    spawns = [{"agent_id": "fix-1", "assignee": "coder", "instruction": "fix it"}, None]
    provider = make_provider(f"script:{script_file(tmp_path, {'review': {'spawn': spawns}})}")
    response = await provider.invoke(request(home, "review"))
    assert response.spawns == spawns


async def test_artifacts_are_written_into_the_artifact_dir(tmp_path: Path, home: Path) -> None:
    files = {"out/report.md": "content", "top.txt": "t"}
    provider = make_provider(f"script:{script_file(tmp_path, {'build': {'artifacts': files}})}")
    req = request(home, "build")
    response = await provider.invoke(req)
    assert (req.artifact_dir / "out" / "report.md").read_text() == "content"
    assert (req.artifact_dir / "top.txt").read_text() == "t"
    assert sorted(response.artifacts) == ["out/report.md", "top.txt"]


@pytest.mark.parametrize("bad", ["../escape.txt", "/etc/passwd-copy", "a/../../b"])
async def test_artifacts_cannot_escape(tmp_path: Path, home: Path, bad: str) -> None:
    provider = make_provider(
        f"script:{script_file(tmp_path, {'build': {'artifacts': {bad: 'x'}}})}"
    )
    with pytest.raises(ProviderError):
        await provider.invoke(request(home, "build"))
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.parametrize("bad", ["../x", "/abs/x", "", "a/../../b", "sub/.."])
async def test_bad_artifact_paths_are_unsafe_path_errors(
    tmp_path: Path, home: Path, bad: str
) -> None:
    provider = make_provider(
        f"script:{script_file(tmp_path, {'build': {'artifacts': {bad: 'x'}}})}"
    )
    with pytest.raises(UnsafePathError, match="artifact path"):
        await provider.invoke(request(home, "build"))
    assert not (home / "artifacts" / "x").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("planted", ["sub", "sub/file.txt", "leg"])
async def test_artifacts_never_follow_a_symlink(tmp_path: Path, home: Path, planted: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    req = request(home, "build")
    leg = req.artifact_dir
    if planted == "leg":  # the leg directory itself is a symlink
        leg.parent.mkdir(parents=True)
        leg.symlink_to(outside, target_is_directory=True)
    else:
        (leg / "sub").parent.mkdir(parents=True)
        if planted == "sub":
            (leg / "sub").symlink_to(outside, target_is_directory=True)
        else:
            (leg / "sub").mkdir()
            (leg / "sub" / "file.txt").symlink_to(outside / "file.txt")
    script = script_file(tmp_path, {"build": {"artifacts": {"sub/file.txt": "x"}}})
    with pytest.raises(UnsafePathError, match="symlink"):
        await make_provider(f"script:{script}").invoke(req)
    assert list(outside.iterdir()) == []


async def test_artifacts_never_write_through_a_hard_link(tmp_path: Path, home: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    req = request(home, "build")
    req.artifact_dir.mkdir(parents=True)
    (req.artifact_dir / "out.txt").hardlink_to(outside)
    script = script_file(tmp_path, {"build": {"artifacts": {"out.txt": "x"}}})
    with pytest.raises(UnsafePathError, match="not a plain file"):
        await make_provider(f"script:{script}").invoke(req)
    assert outside.read_text() == "precious"


async def test_invocation_log_lines(tmp_path: Path, home: Path) -> None:
    provider = make_provider(f"script:{script_file(tmp_path, {'b': {'fail': 'no'}})}")
    before = time.time()
    await provider.invoke(request(home, "a", run_id="run-A"))
    with pytest.raises(ProviderError):
        await provider.invoke(request(home, "b", run_id="run-A"))
    await provider.invoke(request(home, "fix-1", run_id="run-B", kind="spawned"))
    log = invocations(home)
    assert [(line["node"], line["run_id"]) for line in log] == [
        ("a", "run-A"),
        ("b", "run-A"),  # logged before it responds, so failures count too
        ("fix-1", "run-B"),
    ]
    for line in log:
        assert set(line) == {"node", "run_id", "ts"}
        assert before - 1 <= line["ts"] <= time.time() + 1
    raw = (home / INVOCATION_LOG).read_text()
    assert raw.endswith("\n") and raw.count("\n") == 3


def test_spawned_node_is_scripted_and_logged_by_spawn_id(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump({"plan": [{"agent_id": "review", "assignee": "r", "instruction": "x"}]})
    )
    path = script_file(
        tmp_path,
        {
            "review": {"spawn": [{"agent_id": "fix-1", "assignee": "coder", "instruction": "fix"}]},
            "fix-1": {"response": "fixed it", "artifacts": {"patch.diff": "+1"}},
        },
    )
    home = tmp_path / "home"
    result = cli(
        home,
        "flow",
        "--plan",
        plan,
        "--model",
        f"script:{path}",
        "--reactive",
        "all",
        "--checkpoint-version",
        "2",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert [(n["id"], n["kind"], n["status"]) for n in out["nodes"]] == [
        ("review", "planned", "completed"),
        ("fix-1", "spawned", "completed"),
    ]
    assert [line["node"] for line in invocations(home)] == ["review", "fix-1"]
    checkpoint = json.loads(Path(out["checkpoint"]["path"]).read_text())
    (entry,) = checkpoint["spawned"]
    assert entry["response"] == "fixed it" and entry["spawn_id"] == "fix-1"
    assert entry["node_id"] != "fix-1"
    artifact = Path(out["run_dir"]) / "artifacts" / "fix-1" / "patch.diff"
    assert artifact.read_text() == "+1"


def test_unknown_script_key_exits_2_through_the_cli(tmp_path: Path) -> None:
    path = script_file(tmp_path, {"a": {"responses": "typo"}})
    result = cli(tmp_path / "home", "play", "demo", "--model", f"script:{path}")
    assert result.returncode == 2
    assert "responses" in result.stderr and "unknown key" in result.stderr
    assert not (tmp_path / "home" / "runs").exists() or not any(
        (tmp_path / "home" / "runs").iterdir()
    )


async def test_script_stream_emits_chunks_in_order_with_the_delay_between_them(
    tmp_path: Path,
) -> None:
    from steerflow.providers._base import ProviderRequest
    from steerflow.providers.script import ScriptProvider

    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump({"n": {"stream": ["a", "b", "c"], "delay": 0.2, "response": "r"}})
    )
    home = tmp_path / "home"
    home.mkdir()
    stamps: list[tuple[str, float]] = []
    request = ProviderRequest(
        run_id="20250101T000000-abcdef",
        node_key="n",
        node_id="0" * 32,
        kind="planned",
        assignee=None,
        instruction="go",
        history=(),
        artifact_dir=home / "legs" / "n",
        home=home,
        live=lambda text: stamps.append((text, time.monotonic())),
    )
    response = await ScriptProvider(f"script:{path}").invoke(request)
    assert response.text == "r"  # the response, not the stream
    assert [text for text, _ in stamps] == ["a", "b", "c"]
    assert stamps[2][1] - stamps[0][1] >= 0.2  # the delay lies between first and last


def test_script_stream_must_be_a_list_of_strings(tmp_path: Path) -> None:
    from steerflow.providers.script import load_script

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"n": {"stream": "not a list"}}))
    with pytest.raises(UsageError, match="stream"):
        load_script(path)
