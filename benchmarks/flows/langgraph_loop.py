from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

llm = ChatOpenAI(model="gpt-4o-mini")
MAX_ROUNDS = 3


class State(TypedDict):
    draft: str
    critique: str
    rounds: int


def draft(state: State) -> dict:
    if not state.get("draft"):
        return {"draft": llm.invoke("Draft a release note for v2.").content, "rounds": 0}
    prompt = f"Revise the draft.\nDraft:\n{state['draft']}\nCritique:\n{state['critique']}"
    return {"draft": llm.invoke(prompt).content}


def critique(state: State) -> dict:
    reply = llm.invoke(f"Critique this draft; say LGTM if it is ready:\n{state['draft']}")
    return {"critique": reply.content, "rounds": state["rounds"] + 1}


def done(state: State) -> str:
    return END if "LGTM" in state["critique"] or state["rounds"] >= MAX_ROUNDS else "draft"


builder = StateGraph(State)
builder.add_node("draft", draft)
builder.add_node("critique", critique)
builder.add_edge(START, "draft")
builder.add_edge("draft", "critique")
builder.add_conditional_edges("critique", done)
with SqliteSaver.from_conn_string("flow.db") as saver:
    graph = builder.compile(checkpointer=saver)
    print(graph.invoke({"draft": ""}, {"configurable": {"thread_id": "note"}})["draft"])
