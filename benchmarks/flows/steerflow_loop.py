import asyncio

import steerflow
from steerflow import FlowOptions, Loop, Op, Plan

revise = Loop(
    "revise",
    body=[
        Op("draft", "Draft a release note for v2, or revise the draft by its critique."),
        Op("critique", "Critique the draft; say LGTM if it is ready.", depends_on=["draft"]),
    ],
    until={"node": "critique", "contains": "LGTM"},
    max_rounds=3,
)
options = FlowOptions(plan=Plan(ops=[revise]), model="openai/gpt-4o-mini")
result = asyncio.run(steerflow.run_flow(options, home=steerflow.resolve_home()))
print(result.response(f"draft.r{result.loops[0]['rounds']}"))
