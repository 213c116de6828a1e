import operator
from typing import Annotated, TypedDict

from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

llm = ChatOpenAI(model="gpt-4o-mini")
TOPICS = ["prior work", "datasets", "open problems"]


class State(TypedDict):
    findings: Annotated[list[str], operator.add]
    brief: str


def research(state: dict) -> dict:
    return {"findings": [llm.invoke(f"Research {state['topic']}.").content]}


def synthesize(state: State) -> dict:
    found = "\n\n".join(state["findings"])
    return {"brief": llm.invoke(f"Write a one-page brief from every finding:\n{found}").content}


builder = StateGraph(State)
builder.add_node("research", research)
builder.add_node("synthesize", synthesize)
builder.add_conditional_edges(START, lambda s: [Send("research", {"topic": t}) for t in TOPICS])
builder.add_edge("research", "synthesize")
builder.add_edge("synthesize", END)
with SqliteSaver.from_conn_string("flow.db") as saver:
    graph = builder.compile(checkpointer=saver)
    print(graph.invoke({"findings": []}, {"configurable": {"thread_id": "brief"}})["brief"])
