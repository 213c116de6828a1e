from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

llm = ChatOpenAI(model="gpt-4o-mini")


class State(TypedDict):
    paragraph: str
    words: int
    title: str


def write(state: State) -> dict:
    return {"paragraph": llm.invoke("Write a paragraph on durable execution.").content}


def count(state: State) -> dict:
    return {"words": len(state["paragraph"].split())}


def title(state: State) -> dict:
    prompt = f"Title this {state['words']}-word paragraph:\n{state['paragraph']}"
    return {"title": llm.invoke(prompt).content}


builder = StateGraph(State)
builder.add_node("write", write)
builder.add_node("count", count)
builder.add_node("title", title)
builder.add_edge(START, "write")
builder.add_edge("write", "count")
builder.add_edge("count", "title")
builder.add_edge("title", END)
with SqliteSaver.from_conn_string("flow.db") as saver:
    graph = builder.compile(checkpointer=saver)
    print(graph.invoke({}, {"configurable": {"thread_id": "title"}})["title"])
