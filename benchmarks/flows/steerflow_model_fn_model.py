import asyncio

from flow_steps import count_words

import steerflow
from steerflow import FlowOptions, Op, Plan

plan = Plan(
    ops=[
        Op("write", "Write a paragraph on durable execution."),
        Op("count", "Count its words.", fn=count_words, depends_on=["write"]),
        Op("title", "Title the paragraph; its word count is given.", depends_on=["write", "count"]),
    ]
)
options = FlowOptions(plan=plan, model="openai/gpt-4o-mini", allow_python=True)
result = asyncio.run(steerflow.run_flow(options, home=steerflow.resolve_home()))
print(result.response("title"))
