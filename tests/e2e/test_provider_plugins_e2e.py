"""Provider plugins through the entry point group ``steerflow.providers`` (issue 29 item 3).

Real ``steerflow`` processes; the plugins are distributions on the child's ``PYTHONPATH``
(``plugin_dists``), found by ``importlib.metadata`` as installed ones are. The last test
pip-installs the shipped example into a fresh venv (about 16 s on two busy cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from flow_support import child_env, run_cli, write_yaml

from plugin_dists import EXAMPLE, example_dist, fake_dist
from steerflow.checkpoint import load_checkpoint

pytestmark = pytest.mark.timeout(120)

PLAN = {
    "plan": [
        {"agent_id": "a", "instruction": "say hello"},
        {"agent_id": "b", "instruction": "say bye", "depends_on": ["a"]},
    ]
}


def _env(*paths: Path) -> dict[str, str]:
    return child_env(PYTHONPATH=os.pathsep.join(map(str, paths)))


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("steerflow: error: "), stderr
    return lines[0]


def _responses(run_dir: Path) -> dict[str, str]:
    state, _ = load_checkpoint(run_dir / "checkpoint.json")
    return {k: e["response"] for k, e in state["ops"].items()}


def test_the_example_plugin_serves_its_prefix(tmp_path: Path) -> None:
    home, plan = tmp_path / "home", write_yaml(tmp_path / "plan.yaml", PLAN)
    env = _env(*example_dist(tmp_path / "site"))
    result = run_cli(home, "flow", "--plan", plan, "--model", "shout/loud", "--json", env=env)
    assert result.returncode == 0, result.explain()
    run_dir = Path(result.json["run_dir"])
    responses = _responses(run_dir)
    assert responses["a"] == "[loud a] SAY HELLO"
    assert responses["b"].startswith("[loud b] SAY BYE\n\n[RESULTS OF DEPENDENCIES]")
    assert result.json["usage"]["input_tokens"] > 0, result.explain()
    # it writes nothing and says so: no leg directory was made for its nodes
    artifacts = run_dir / "artifacts"
    assert not artifacts.exists() or list(artifacts.iterdir()) == []


def test_an_unknown_prefix_names_the_entry_point_group(tmp_path: Path) -> None:
    plan = write_yaml(tmp_path / "plan.yaml", PLAN)
    env = _env(*example_dist(tmp_path / "site"))
    result = run_cli(tmp_path / "home", "flow", "--plan", plan, "--model", "whisper/x", env=env)
    assert result.returncode == 2, result.explain()
    line = _one_error_line(result.stderr)
    assert "unknown provider 'whisper'" in line and "'steerflow.providers'" in line


def test_a_distribution_shadowing_a_built_in_name_is_refused(tmp_path: Path) -> None:
    home, plan = tmp_path / "home", write_yaml(tmp_path / "plan.yaml", PLAN)
    marker = tmp_path / "shadow-imported"
    shadow = fake_dist(
        tmp_path / "shadow",
        "shadow-dist",
        {"openai": "shadow_mod:factory"},
        {"shadow_mod": f"open({str(marker)!r}, 'w').close()\ndef factory(spec): return None\n"},
    )
    env = _env(*example_dist(tmp_path / "site"), shadow)
    refused = run_cli(home, "flow", "--plan", plan, "--model", "shout/loud", env=env)
    assert refused.returncode == 2, refused.explain()
    line = _one_error_line(refused.stderr)
    assert "distribution 'shadow-dist'" in line and "built-in provider name 'openai'" in line
    # a built-in spec never reads the group, so the shadow is never even imported
    echo = run_cli(home, "flow", "--plan", plan, "--model", "echo", env=env)
    assert echo.returncode == 0, echo.explain()
    assert not marker.exists()


BROKEN = {
    "import-error": (
        {"broken_mod": "import steerflow_no_such_dependency\n"},
        "failed to load: ModuleNotFoundError: No module named 'steerflow_no_such_dependency'",
    ),
    "factory-raises": (
        {"broken_mod": "def factory(spec):\n    raise RuntimeError('no API key\\nset')\n"},
        "raised RuntimeError: no API key set",
    ),
    "not-a-provider": (
        {"broken_mod": "def factory(spec):\n    return {'spec': spec}\n"},
        "returned dict, not a steerflow.providers.Provider",
    ),
    # SystemExit is no way out of steerflow: exit 0 would read as success
    "exits-at-import": (
        {"broken_mod": "import sys\nsys.exit(0)\n"},
        "failed to load: SystemExit: 0",
    ),
    "factory-exits": (
        {"broken_mod": "def factory(spec):\n    raise SystemExit(4)\n"},
        "raised SystemExit: 4",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_plugin_is_a_one_line_usage_error_naming_it(tmp_path: Path, case: str) -> None:
    modules, problem = BROKEN[case]
    site = fake_dist(tmp_path / "site", "acme-broken", {"acme": "broken_mod:factory"}, modules)
    plan = write_yaml(tmp_path / "plan.yaml", PLAN)
    result = run_cli(
        tmp_path / "home", "flow", "--plan", plan, "--model", "acme/big", env=_env(site)
    )
    assert result.returncode == 2, result.explain()
    line = _one_error_line(result.stderr)
    assert line == (
        "steerflow: error: model spec 'acme/big': plugin 'acme' (entry point "
        f"'broken_mod:factory' of distribution 'acme-broken') {problem}"
    )
    assert not (tmp_path / "home" / "runs").exists() or not any(
        (tmp_path / "home" / "runs").iterdir()
    )


def test_two_distributions_registering_one_name_are_refused(tmp_path: Path) -> None:
    one = fake_dist(tmp_path / "one", "acme-one", {"acme": "m1:factory"})
    two = fake_dist(tmp_path / "two", "acme-two", {"acme": "m2:factory"})
    plan = write_yaml(tmp_path / "plan.yaml", PLAN)
    result = run_cli(
        tmp_path / "home", "flow", "--plan", plan, "--model", "acme/x", env=_env(one, two)
    )
    assert result.returncode == 2, result.explain()
    line = _one_error_line(result.stderr)
    assert "'acme-one'" in line and "'acme-two'" in line


def test_the_example_pip_installed_into_a_fresh_venv(tmp_path: Path) -> None:
    """The real install: a venv seeing this one's packages, the example pip-installed into it
    (its build backend from the package index pip is configured with), then ``steerflow``
    run by that venv with ``shout/``."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # this venv's site dir, .pth files included (steerflow is an editable install there)
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "steerflow-dev.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    # from a copy: a build writes build/ and *.egg-info beside the sources
    source = shutil.copytree(EXAMPLE, tmp_path / "example")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", str(source)],
        check=True, capture_output=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    plan = write_yaml(tmp_path / "plan.yaml", PLAN)
    env = child_env()
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [python, "-m", "steerflow", "--home", tmp_path / "home", "flow", "--plan", plan,
         "--model", "shout/x", "--json"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _responses(Path(json.loads(done.stdout)["run_dir"]))["a"] == "[x a] SAY HELLO"
    shown = subprocess.run(
        [python, "-m", "pip", "show", "steerflow-provider-example"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"Location: {purelib}" in shown  # installed into the new venv, not on a path


#: A plugin whose provider plans by raising and answers nodes with a bare ``str``.
MISBEHAVING = """
from steerflow.providers import Provider


class Misbehaving(Provider):
    needs_artifact_dir = False

    def __init__(self, spec):
        self.spec = spec

    async def invoke(self, request):
        return "a bare string"

    async def plan(self, request):
        raise RuntimeError("planner down\\nsecond line")


def factory(spec):
    return Misbehaving(spec)
"""


def test_a_plugin_whose_plan_raises_fails_the_run_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    site = fake_dist(tmp_path / "site", "acme-odd", {"acme": "odd_mod:factory"},
                     {"odd_mod": MISBEHAVING})  # fmt: skip
    result = run_cli(home, "flow", "do things", "--model", "acme/big", env=_env(site))
    assert result.returncode == 1, result.explain()
    line = _one_error_line(result.stderr)
    assert line == (
        "steerflow: error: model spec 'acme/big': plugin 'acme' (odd_mod.Misbehaving) "
        "raised RuntimeError: planner down second line while planning"
    ), result.explain()
    runs = run_cli(home, "runs", "--json")
    assert [r["status"] for r in runs.json["runs"]] == ["failed"], runs.explain()


def test_a_plugin_invoke_returning_a_str_fails_its_node_naming_the_plugin(tmp_path: Path) -> None:
    site = fake_dist(tmp_path / "site", "acme-odd", {"acme": "odd_mod:factory"},
                     {"odd_mod": MISBEHAVING})  # fmt: skip
    plan = write_yaml(tmp_path / "plan.yaml", PLAN)
    result = run_cli(
        tmp_path / "home", "flow", "--plan", plan, "--model", "acme/big", "--json", env=_env(site)
    )
    assert result.returncode == 1, result.explain()
    nodes = {n["id"]: n for n in result.json["nodes"]}
    assert nodes["a"]["status"] == "failed" and nodes["b"]["status"] == "skipped"
    assert nodes["a"]["error"] == (
        "model spec 'acme/big': plugin 'acme' (odd_mod.Misbehaving) returned str from "
        "invoke, not a steerflow.providers.ProviderResponse"
    ), result.explain()
