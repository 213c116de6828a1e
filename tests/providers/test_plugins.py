"""Provider plugins in process: when the entry point group is read, and what comes back.

The distributions are ``plugin_dists`` directories put on ``sys.path``, which
``importlib.metadata`` reads as it reads installed ones (the CLI tests are in
``tests/e2e/test_provider_plugins_e2e.py``).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from plugin_dists import example_dist, fake_dist
from steerflow import UsageError
from steerflow.providers import BUILTIN_NAMES, ProviderRequest, _plugins, make_provider

REQUEST = ProviderRequest(
    run_id="r",
    node_key="a",
    node_id="a",
    kind="planned",
    assignee=None,
    instruction="make it loud",
    history=(),
    artifact_dir=Path("/nonexistent/a"),
    home=Path("/nonexistent"),
)


def test_built_in_specs_never_read_the_entry_point_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def scan(**_: object) -> object:
        raise AssertionError("the entry point group was read for a built-in spec")

    monkeypatch.setattr(importlib.metadata, "entry_points", scan)
    for spec in ("echo", "echo:delay=0", "python:fn_nodes:record"):
        make_provider(spec)
    with pytest.raises(AssertionError, match="entry point group was read"):
        make_provider("acme/x")  # the spy is live: a plugin prefix reads the group
    monkeypatch.undo()
    with pytest.raises(UsageError, match="unknown provider 'acme'"):
        make_provider("acme/x")


def test_the_built_in_names_are_every_prefix_the_registry_knows() -> None:
    assert {"echo", "script", "python", "openai", "anthropic", "claude-code", "codex"} == (
        BUILTIN_NAMES
    )


async def test_the_example_plugin_is_found_and_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for entry in example_dist(tmp_path / "site"):
        monkeypatch.syspath_prepend(str(entry))
    provider = make_provider("shout/loud")
    assert type(provider).__name__ == "ShoutProvider" and provider.spec == "shout/loud"
    assert provider.needs_artifact_dir is False
    response = await provider.invoke(REQUEST)
    assert response.text == "[loud a] MAKE IT LOUD"
    assert response.usage is not None and response.usage.input_tokens == 3


def test_a_factory_that_sets_no_spec_gets_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "from steerflow.providers import EchoProvider\n"
        "class Quiet(EchoProvider):\n"
        "    def __init__(self): pass\n"
        "def factory(spec): return Quiet()\n"
    )
    site = fake_dist(tmp_path / "site", "quiet-dist", {"quiet": "quiet_mod:factory"},
                     {"quiet_mod": source})  # fmt: skip
    monkeypatch.syspath_prepend(str(site))
    assert make_provider("quiet/x").spec == "quiet/x"


def test_a_shadowing_entry_point_is_refused_whatever_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for entry in example_dist(tmp_path / "site"):
        monkeypatch.syspath_prepend(str(entry))
    shadow = fake_dist(tmp_path / "shadow", "python-shadow", {"python": "nowhere:factory"})
    monkeypatch.syspath_prepend(str(shadow))
    with pytest.raises(UsageError) as info:
        _plugins.plugin_provider("shout", "shout/x")
    assert str(info.value) == (
        "distribution 'python-shadow' registers the built-in provider name 'python' in the "
        "'steerflow.providers' entry point group (nowhere:factory); built-in providers cannot "
        "be shadowed: uninstall it or rename its entry point"
    )
