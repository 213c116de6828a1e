"""One step of a tool node's loop, as a model sees it (issue 39, decision 253).

A tool node is a conversation: the node's instruction, then model replies that may ask
for tools, then the tools' results, then the next reply, until a reply asks for none.
A model that calls tools implements :meth:`Provider.invoke_step` over these types; the
loop itself (journaling each step, replaying them on resume, steering between them)
lives in ``steerflow.tools`` and never in a provider.

Standard library only: a plugin implements the protocol without importing the tools
package, and nodes without tools never load it.
"""

from __future__ import annotations

from steerflow.providers._base import (
    ConversationItem,
    ModelTurn,
    StepReply,
    StepRequest,
    ToolCall,
    ToolResult,
    ToolSpec,
)

__all__ = [
    "ConversationItem",
    "ModelTurn",
    "StepReply",
    "StepRequest",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
]
