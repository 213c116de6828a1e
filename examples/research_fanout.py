"""A research fan-out with a synthesis, built in code and run on the offline ``echo`` model.

    python examples/research_fanout.py [--home DIR] [--model SPEC] [--save-plan FILE]

Three researchers work in parallel, a reviewer reads their findings, and a synthesis
merges everything. ``--save-plan`` also writes the plan as YAML, which ``steerflow flow
--plan FILE`` runs as it is. The run is resumable like any other: ``steerflow resume RUN``.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import steerflow
import steerflow.views
from steerflow import Op, Plan, Synthesis

TOPICS = ("prior work", "datasets", "open problems")


def research_plan(question: str) -> Plan:
    """One researcher per topic, a reviewer over all of them, and the synthesis."""
    researchers = [
        Op(f"research-{i}", f"Research {topic} for: {question}", assignee="researcher")
        for i, topic in enumerate(TOPICS)
    ]
    review = Op(
        "review",
        "Check the findings for gaps and contradictions.",
        depends_on=[op.agent_id for op in researchers],
        assignee="reviewer",
    )
    return Plan(
        name="research fan-out",
        ops=[*researchers, review],
        synthesis=Synthesis("Write a one-page brief from every finding and the review."),
        concurrency=3,
    )


def main() -> int:
    """Build the plan, run it, print each node's status and the run's result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="steerflow home (default: STEERFLOW_HOME or ~/.steerflow)")
    parser.add_argument("--model", default="echo", help="model spec (default: echo, offline)")
    parser.add_argument("--save-plan", type=Path, help="also write the plan as YAML here")
    parser.add_argument("--question", default="How do small models learn arithmetic?")
    args = parser.parse_args()

    plan = research_plan(args.question)
    if args.save_plan is not None:
        args.save_plan.write_text(plan.to_yaml(), encoding="utf-8")
    home = steerflow.resolve_home(args.home)
    options = steerflow.FlowOptions(plan=plan, model=args.model)
    result = asyncio.run(steerflow.run_flow(options, home=home))
    print(f"run {result.run_id}: {result.status}")
    for node in result.nodes:
        print(f"  {node['id']}: {node['status']}")
    if result.run_id is not None:
        print(steerflow.views.run_result(home, result.run_id).text)
    return int(result.exit_code)


if __name__ == "__main__":
    raise SystemExit(main())
