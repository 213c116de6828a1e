import asyncio

import steerflow
from steerflow import FlowOptions, Op, Plan, Synthesis

topics = ["prior work", "datasets", "open problems"]
plan = Plan(
    ops=[Op(f"research-{i}", f"Research {t}.") for i, t in enumerate(topics)],
    synthesis=Synthesis("Write a one-page brief from every finding."),
)
options = FlowOptions(plan=plan, model="openai/gpt-4o-mini")
result = asyncio.run(steerflow.run_flow(options, home=steerflow.resolve_home()))
print(result.response("synthesis"))
