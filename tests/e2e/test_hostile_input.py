"""Careless and hostile input gets a typed answer (issue 11, items 6 and 7).

Every test runs the real CLI in a subprocess. Permission tests must not pass by accident
when the suite runs as root (as CI does): there the child keeps uid 0 but loses
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding set, so file modes bind it like
any other user (its interpreter under a 0700 ``/root`` stays readable: it owns it).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest
from flow_support import (
    PYTHON,
    CliResult,
    chain_plan,
    child_env,
    drop_dac_caps,
    run_cli,
    run_unprivileged,
)

from steerflow.control import MAX_MESSAGE_BYTES
from waiting import wait_until

SLOWPLAN = Path(__file__).with_name("ctl_slowplan.py")


def _one_error_line(result: CliResult) -> str:
    assert "Traceback" not in result.stderr, result.explain()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.explain()
    assert lines[0].startswith("steerflow: error: "), result.explain()
    return lines[0]


def _run_dirs(home: Path) -> list[str]:
    runs = home / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    return chain_plan(tmp_path / "plan.yaml", ("a", "b"))


# ------------------------------------------------------------------ item 6: typed errors


def test_probe_really_binds_root(tmp_path: Path) -> None:
    """The unprivileged runner is what makes the permission tests below real."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    probe = subprocess.run(
        [PYTHON, "-c", f"import os; print(os.access({str(locked)!r}, os.W_OK))"],
        capture_output=True,
        text=True,
        preexec_fn=drop_dac_caps if os.geteuid() == 0 else None,
        check=True,
    )
    assert probe.stdout.strip() == "False"


def test_unwritable_existing_home_is_refused_in_one_line(home: Path, plan: Path) -> None:
    home.mkdir(mode=0o700)
    home.chmod(0o500)
    try:
        result = run_unprivileged(home, "flow", "--plan", plan)
        assert result.returncode == 3, result.explain()
        assert "not writable" in _one_error_line(result)
        as_json = run_unprivileged(home, "runs", "--json")
        assert as_json.returncode == 3, as_json.explain()
        assert as_json.json["error"]["code"] == "home-refused"
        assert as_json.json["exit_code"] == 3
    finally:
        home.chmod(0o700)
    assert list(home.iterdir()) == []  # nothing was created: no runs/, no state DB


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["flow", "--plan", "{plan}", "--bogus-flag", "--json"], id="unknown-flag"),
        pytest.param(["flow", "--plan", "{plan}", "--concurrency", "0", "--json"], id="range"),
        pytest.param(["flow", "--plan", "{tmp}", "--json"], id="plan-is-a-directory"),
        pytest.param(["--home", "{plan}", "runs", "--json"], id="home-is-a-file"),
        pytest.param(["show", "--json"], id="missing-argument"),
    ],
)
def test_parser_errors_print_one_json_object(args: list[str], plan: Path, tmp_path: Path) -> None:
    argv = [a.format(plan=plan, tmp=tmp_path) for a in args]
    proc = subprocess.run(
        [PYTHON, "-m", "steerflow", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(STEERFLOW_HOME=str(tmp_path / "home")),
        check=False,
    )
    result = CliResult(argv, proc.returncode, proc.stdout, proc.stderr)
    assert result.returncode == 2, result.explain()
    out = result.json
    assert out["status"] == "error" and out["exit_code"] == 2
    assert out["error"]["code"] == "usage" and out["error"]["message"]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "soon"])
def test_timeout_must_be_a_positive_finite_number(value: str, home: Path, plan: Path) -> None:
    result = run_cli(home, "flow", "--plan", plan, "--timeout", value, "--json")
    assert result.returncode == 2, result.explain()
    assert "--timeout" in result.json["error"]["message"]
    resumed = run_cli(home, "resume", "20250101T000000-abcdef", "--timeout", value)
    assert resumed.returncode == 2, resumed.explain()
    assert _run_dirs(home) == []


@pytest.mark.parametrize("value", ["1e12", "1e300", "3601", "0.1"])
def test_a_lease_out_of_range_is_a_usage_error_naming_the_variable(
    value: str, home: Path, plan: Path
) -> None:
    """``STEERFLOW_LEASE_S`` is bounded (0.5 to 3600 s, decision 248): no run starts."""
    result = run_cli(home, "flow", "--plan", plan, "--json", env=child_env(STEERFLOW_LEASE_S=value))
    assert result.returncode == 2, result.explain()
    assert result.json["error"]["message"] == (
        f"invalid value for STEERFLOW_LEASE_S: {value!r} is not a number of seconds "
        "from 0.5 to 3600"
    )
    assert _run_dirs(home) == []


def test_busy_state_db_refuses_the_start_and_leaves_no_run_directory(
    home: Path, plan: Path
) -> None:
    first = run_cli(home, "flow", "--plan", plan, "--json")
    assert first.returncode == 0, first.explain()
    before = _run_dirs(home)
    holder = sqlite3.connect(home / "state.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # hold the write lock past the 10 s bound
        result = run_cli(home, "flow", "--plan", plan, "--json", timeout=90)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.returncode == 3, result.explain()
    assert result.json["error"]["code"] == "database-busy"
    assert _run_dirs(home) == before


def test_read_only_state_db_refuses_the_start_and_leaves_no_run_directory(
    home: Path, plan: Path
) -> None:
    first = run_cli(home, "flow", "--plan", plan, "--json")
    assert first.returncode == 0, first.explain()
    before = _run_dirs(home)
    db = home / "state.db"
    db.chmod(0o400)
    try:
        result = run_unprivileged(home, "flow", "--plan", plan, "--json")
    finally:
        db.chmod(0o600)
    assert result.returncode == 3, result.explain()
    assert "read-only" in result.json["error"]["message"]
    assert _run_dirs(home) == before


def test_failed_state_db_initialisation_leaves_no_init_file(home: Path, plan: Path) -> None:
    env = child_env(STEERFLOW_FAULT="eio:after:state-init")
    result = run_cli(home, "flow", "--plan", plan, env=env)
    assert result.returncode == 1, result.explain()
    assert "cannot create the state database" in _one_error_line(result)
    assert sorted(p.name for p in home.iterdir()) == []  # no state.db, no .state.db.*.init*


def _interrupted_while_planning(home: Path) -> str:
    """A run interrupted (SIGINT) while the planner was still thinking: no checkpoint.

    SIGINT cancels the planner call; a deadline would let it finish (decision 101).
    """
    proc = subprocess.Popen(
        [PYTHON, str(SLOWPLAN), "--home", str(home), "flow", "do it"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        wait_until((home / "planner-calls.log").exists, timeout=30, what="the planner call")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out + err
    assert "resume with" not in out
    assert "nothing to resume" in out
    [run_id] = _run_dirs(home)
    assert not (home / "runs" / run_id / "checkpoint.json").exists()
    return run_id


def test_no_resume_hint_and_no_none_fields_without_a_checkpoint(home: Path) -> None:
    run_id = _interrupted_while_planning(home)
    shown = run_cli(home, "show", run_id)
    assert shown.returncode == 0, shown.explain()
    assert "None" not in shown.stdout
    assert "checkpoint: none" in shown.stdout


def test_show_of_an_unknown_id_is_unknown_id(home: Path, plan: Path) -> None:
    assert run_cli(home, "flow", "--plan", plan).returncode == 0
    for target in ("nosuchrun", "20990101T000000-abcdef", "ffff0000"):
        result = run_cli(home, "show", target, "--json")
        assert result.returncode == 3, result.explain()
        assert result.json["error"]["code"] == "unknown-id", result.explain()
    empty = run_cli(home.parent / "empty-home", "show", "whatever", "--json")
    assert empty.json["error"]["code"] == "unknown-id", empty.explain()


@pytest.mark.parametrize(
    "args", [("show", "{t}"), ("resume", "{t}"), ("ctl", "pause", "{t}"), ("ctl", "status", "{t}")]
)
def test_error_lines_echo_at_most_200_characters_of_a_target(
    args: tuple[str, ...], home: Path, plan: Path
) -> None:
    assert run_cli(home, "flow", "--plan", plan).returncode == 0
    target = "deadbeef" + "z" * 5000
    result = run_cli(home, *(a.format(t=target) for a in args))
    assert result.returncode == 3, result.explain()
    line = _one_error_line(result)
    assert "z" * 192 in line and "z" * 193 not in line  # 200 characters of the target
    assert "(5008 characters)" in line
    assert len(line) < 400


def test_ctl_msg_refuses_blank_and_oversized_text(home: Path, plan: Path) -> None:
    assert run_cli(home, "flow", "--plan", plan).returncode == 0
    session = "ab" * 16  # never reached: the text is checked first
    for text in ("", "   ", " \n\t "):
        result = run_cli(home, "ctl", "msg", session, text)
        assert result.returncode == 2, result.explain()
        assert "empty" in _one_error_line(result)
    too_big = "é" * (MAX_MESSAGE_BYTES // 2) + "x"  # 64 KiB + 1 byte in UTF-8
    result = run_cli(home, "ctl", "msg", session, too_big)
    assert result.returncode == 2, result.explain()
    assert "65536 bytes (64 KiB)" in _one_error_line(result)
    at_limit = run_cli(home, "ctl", "msg", session, "x" * MAX_MESSAGE_BYTES)
    assert at_limit.returncode == 3, at_limit.explain()  # accepted text, unknown session


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        (("runs",), {"0", "1", "2", "3"}),
        (("show",), {"0", "1", "2", "3"}),
        (("ctl", "status"), {"0", "1", "2", "3"}),
        (("ctl", "pause"), {"0", "1", "2", "3"}),
        (("ctl", "resume"), {"0", "1", "2", "3"}),
        (("ctl", "msg"), {"0", "1", "2", "3"}),
        (("ctl", "stop"), {"0", "1", "2", "3"}),
        (("ctl", "resolve"), {"0", "1", "2", "3"}),
    ],
)
def test_help_lists_only_the_exit_codes_a_command_can_return(
    command: tuple[str, ...], codes: set[str], tmp_path: Path
) -> None:
    result = run_cli(tmp_path / "home", *command, "--help")
    assert result.returncode == 0, result.explain()
    epilog = result.stdout.split("Exit codes:", 1)[1]
    listed = {line.split()[0] for line in epilog.splitlines() if line.strip()[:1].isdigit()}
    assert listed == codes, result.stdout


# ------------------------------------------------------- item 7: homes and run ids


def _completed_run(home: Path, plan: Path) -> str:
    result = run_cli(home, "flow", "--plan", plan, "--json")
    assert result.returncode == 0, result.explain()
    return str(result.json["run_id"])


def test_a_symlink_in_runs_is_never_followed_by_id(tmp_path: Path, plan: Path) -> None:
    outside = tmp_path / "outside"
    run_id = _completed_run(outside, plan)
    home = tmp_path / "home"
    assert run_cli(home, "runs").returncode == 0  # creates the home
    (home / "runs").mkdir(mode=0o700)
    (home / "runs" / run_id).symlink_to(outside / "runs" / run_id)
    for args in (("show", run_id), ("show", run_id[:10]), ("resume", run_id, "--dry-run")):
        result = run_cli(home, *args, "--json")
        assert result.returncode == 3, result.explain()
        assert result.json["error"]["code"] == "unknown-id", result.explain()
        assert "checkpoint" not in result.stdout.replace("checkpoint_recovery", "")


def test_a_session_whose_run_dir_is_a_symlink_is_refused(tmp_path: Path, plan: Path) -> None:
    home = tmp_path / "home"
    run_id = _completed_run(home, plan)
    session = json.loads(run_cli(home, "runs", "--json").stdout)["runs"][0]["session_id"]
    outside = tmp_path / "elsewhere"
    (home / "runs" / run_id).rename(outside)
    (home / "runs" / run_id).symlink_to(outside)
    result = run_cli(home, "show", session, "--json")
    assert result.returncode == 3, result.explain()
    assert "symlink" in result.json["error"]["message"]


def test_home_may_be_a_symlink_to_a_directory(tmp_path: Path, plan: Path) -> None:
    real = tmp_path / "real-home"
    real.mkdir(mode=0o700)
    link = tmp_path / "home-link"
    link.symlink_to(real)
    run_id = _completed_run(link, plan)
    assert (real / "runs" / run_id / "checkpoint.json").is_file()
    shown = run_cli(link, "show", run_id, "--json")
    assert shown.returncode == 0, shown.explain()
    assert shown.json["status"] == "completed"


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777])
def test_a_home_others_can_write_is_refused_unless_allowed(
    mode: int, home: Path, plan: Path
) -> None:
    home.mkdir(mode=0o700)
    home.chmod(mode)
    result = run_cli(home, "flow", "--plan", plan)
    assert result.returncode == 3, result.explain()
    line = _one_error_line(result)
    assert "writable by group or others" in line and "STEERFLOW_ALLOW_SHARED_HOME=1" in line
    assert list(home.iterdir()) == []
    allowed = run_cli(home, "flow", "--plan", plan, env=child_env(STEERFLOW_ALLOW_SHARED_HOME="1"))
    assert allowed.returncode == 0, allowed.explain()
    assert _mode(home) == mode  # allowed means used as it is, not re-moded


def test_a_home_owned_by_someone_else_is_refused_unless_allowed(tmp_path: Path, plan: Path) -> None:
    if os.geteuid() == 0:
        home = tmp_path / "theirs"
        home.mkdir(mode=0o700)
        os.chown(home, 65534, 65534)  # nobody
        owner = 65534
    else:
        home, owner = Path("/"), 0  # owned by root, and we are not root
    result = run_cli(home, "runs")
    assert result.returncode == 3, result.explain()
    assert f"owned by uid {owner}" in _one_error_line(result)
    if os.geteuid() == 0:  # root may write there: the override is all it needs
        allowed = run_cli(home, "runs", env=child_env(STEERFLOW_ALLOW_SHARED_HOME="1"))
        assert allowed.returncode == 0, allowed.explain()


def test_a_new_home_is_created_0700(home: Path) -> None:
    assert run_cli(home, "runs").returncode == 0
    assert _mode(home) == 0o700
