"""Ray placement rules without a cluster: what a role asks for, and who can give it.

The rules that refuse a plan before anything runs (``roles.<role>.resources``) are pure
functions over plain data, so every branch is checked here; the cluster itself is in
``tests/e2e/test_ray_e2e.py``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from steerflow import Op, Plan, Role
from steerflow.cluster import ray_options, request_of, unplaceable
from steerflow.errors import PlanValidationError
from steerflow.orchestrate import FlowOptions
from steerflow.orchestrate._settings import RunSettings
from steerflow.plan import parse_plan
from steerflow.plan._model import resource_problem

HEAD = {"CPU": 1.0, "memory": 8e9, "object_store_memory": 8e7, "node:__internal_head__": 1.0}
SIDE = {"CPU": 1.0, "memory": 8e9, "side": 1.0}


def test_a_role_without_resources_asks_for_rays_default_cpu() -> None:
    assert request_of(None) == {"CPU": 1.0}
    assert ray_options(None) == {}
    # asking only for a custom resource still reserves Ray's default CPU, as Ray does
    assert request_of({"side": 1}) == {"CPU": 1.0, "side": 1.0}


def test_plan_keywords_become_rays_options_and_node_resources() -> None:
    asked = {"num_cpus": 0.5, "num_gpus": 1, "memory": 2_000_000_000, "side": 2}
    assert ray_options(asked) == {
        "num_cpus": 0.5,
        "num_gpus": 1.0,
        "memory": 2_000_000_000,
        "resources": {"side": 2.0},
    }
    assert request_of(asked) == {"CPU": 0.5, "GPU": 1.0, "memory": 2e9, "side": 2.0}
    # zero is "none of it": Ray places a num_cpus 0 call anywhere
    assert request_of({"num_cpus": 0}) == {}


def test_a_request_is_placeable_only_on_one_node_that_has_all_of_it() -> None:
    nodes = [HEAD, SIDE]
    roles: dict[str | None, Any] = {
        None: None,
        "side": {"side": 1, "num_cpus": 0.5},
        "big": {"num_cpus": 2},
        "gpu": {"num_gpus": 1},
        # each part exists on some node, but no single node has both
        "split": {"side": 1, "object_store_memory_x": 0, "node:__internal_head__": 1},
    }
    assert dict(unplaceable(roles, nodes)) == {
        "big": "no node has CPU 2 (most on one node: 1)",
        "gpu": "no node has GPU 1 (most on one node: 0)",
        "split": "no single node has all of it at once",
    }
    assert unplaceable({"any": None}, []) == [("any", "the cluster has no alive node")]


@pytest.mark.parametrize(
    ("name", "amount", "problem"),
    [
        ("num_cpus", 0.5, None),
        ("memory", 1024, None),
        ("side", 3, None),
        ("accelerator_type:A100", 0.25, None),
        ("CPU", 1, "spell it 'num_cpus'"),
        ("GPU", 1, "spell it 'num_gpus'"),
        ("object_store_memory", 1, "not a resource name a call can request"),
        ("has space", 1, "not a resource name a call can request"),
        ("side", -1, "-1 is not a finite number >= 0"),
        ("side", math.inf, "inf is not a finite number >= 0"),
        ("side", math.nan, "nan is not a finite number >= 0"),
        ("side", 1.5, "1.5: a quantity above 1 must be a whole number"),
        ("memory", 0.5, "0.5 is not a whole number of bytes"),
        ("side", True, "True is not a number"),
        ("side", "1", "'1' is not a number"),
    ],
)
def test_each_resource_rule(name: str, amount: object, problem: str | None) -> None:
    assert resource_problem(name, amount) == problem


def test_a_plan_with_a_bad_resource_is_refused_naming_role_and_key() -> None:
    data = {
        "roles": {"side": {"resources": {"CPU": 1}}},
        "plan": [{"agent_id": "a", "instruction": "x"}],
    }
    with pytest.raises(PlanValidationError) as info:
        parse_plan(data, source="plan.yaml")
    message = str(info.value)
    assert "side" in message and "resources.CPU: spell it 'num_cpus'" in message, message


def test_resources_survive_a_code_plan_its_yaml_and_the_checkpoint_config(tmp_path: Path) -> None:
    plan = Plan(
        ops=[Op(agent_id="a", instruction="x", assignee="side")],
        roles={"side": Role(resources={"side": 1, "num_cpus": 0.5}), "plain": Role(model="echo")},
    )
    path = tmp_path / "plan.yaml"
    path.write_text(plan.to_yaml(), encoding="utf-8")
    assert Plan.from_file(path) == plan
    settings = RunSettings.from_options(FlowOptions(plan=plan), plan.plan_file)
    assert settings.role_resources == {"side": {"side": 1.0, "num_cpus": 0.5}}
    config = settings.to_checkpoint_config()
    # only a role that asks for resources stores them: other plans' bytes are unchanged
    assert config["roles"]["side"]["resources"] == {"side": 1.0, "num_cpus": 0.5}
    assert "resources" not in config["roles"]["plain"]
    assert RunSettings.from_checkpoint_config(config).role_resources == settings.role_resources
