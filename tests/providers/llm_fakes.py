"""Loopback fakes for the provider tests: LLM HTTP servers and agent CLIs.

``FakeLLMServer`` speaks just enough of the OpenAI chat-completions API
(``POST /v1/chat/completions``) or the Anthropic Messages API
(``POST /v1/messages``) for the real SDKs. Replies are scripted as a queue of
:class:`Reply` (status, body, delay, headers, gate) with an optional reply used
"forever" once the queue is empty, or routed by a needle in the request body
(optionally a sequence per route, e.g. 429 then 200); every request is
recorded. A reply with a ``gate`` (a :class:`threading.Event`) is held until
the test sets it, so a flow can be kept live at a known point. A streamed request
(``"stream": true``) gets server-sent events over HTTP/1.1 chunked, closed after the
reply (``Connection: close``), or, by the reply's ``stream_as``, the whole completion
as JSON (a server that does not stream) or a stream that stops at its final chunk.

``write_fake_agent`` writes a Python script that stands in for ``claude`` or
``codex``: it records its argv, cwd, stdin and pid, writes artifact files,
and then answers, fails, or hangs as its JSON config says (``when`` picks
per-prompt overrides, so one fake can behave differently per node;
``wait_for`` holds it until a file exists).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from waiting import wait_until

Flavour = Literal["openai", "anthropic"]


@dataclass
class Reply:
    """One scripted HTTP reply.

    ``body`` may be a dict (sent as JSON) or a str (sent as is); when None a
    success body carrying ``text`` and the token counts is built. With ``gate``
    the reply is held until the event is set (or the server closes).
    """

    status: int = 200
    text: str = "ok"
    body: object = None
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    input_tokens: int = 11
    output_tokens: int = 7
    usage_extra: dict[str, Any] = field(default_factory=dict)
    gate: threading.Event | None = None
    #: For a streamed request (``"stream": true``): the text deltas sent (default: ``text``
    #: in three pieces); ``cut_after`` closes the connection after that many deltas with
    #: no terminating chunk (HTTP/1.1 chunked, so the client sees a cut body);
    #: ``hold`` holds the stream after ``hold_after`` deltas until it is set.
    chunks: list[str] | None = None
    cut_after: int | None = None
    hold: threading.Event | None = None
    hold_after: int = 1
    #: How a streamed request is answered: ``"sse"`` (the whole event stream); ``"json"``
    #: (the stream flag ignored: one whole completion, as a server that does not stream);
    #: ``"final"`` (an event stream that stops at the final chunk: OpenAI's
    #: ``finish_reason`` chunk, carrying the usage, and no ``[DONE]``; Anthropic's
    #: ``message_delta`` with its ``stop_reason``, and no ``message_stop``).
    stream_as: Literal["sse", "json", "final"] = "sse"
    #: With ``stream_as="final"``: the connection is closed after the last event without
    #: the terminating chunk (a proxy that drops the connection once the reply is over).
    cut_at_end: bool = False
    #: The content type of a JSON reply; None sends none.
    content_type: str | None = "application/json"
    #: After a whole streamed reply the server's thread waits this long before it closes
    #: the connection (what a loaded machine's scheduler may do, made certain).
    linger: float = 0.0


def _pieces(text: str) -> list[str]:
    third = max(1, len(text) // 3)
    return [text[i : i + third] for i in range(0, len(text), third)] or [""]


def openai_events(reply: Reply, model: str) -> list[dict[str, Any]]:
    """The SSE ``data:`` objects of a streamed chat completion: deltas, finish, usage.

    With ``stream_as="final"`` the usage rides on the finish chunk, which ends the stream
    (as servers that send no separate usage chunk do).
    """
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
    deltas = [
        {**base, "choices": [{"index": 0, "delta": {"content": c}, "finish_reason": None}]}
        for c in (reply.chunks if reply.chunks is not None else _pieces(reply.text))
    ]
    finish = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = openai_body(reply, model)["usage"]
    if reply.stream_as == "final":
        return [*deltas, {**finish, "usage": usage}]
    return [*deltas, finish, {**base, "choices": [], "usage": usage}]


def anthropic_events(reply: Reply, model: str) -> list[dict[str, Any]]:
    """The SSE events of a streamed Messages reply (each object carries its ``type``)."""
    start_usage = {"input_tokens": reply.input_tokens, "output_tokens": 1, **reply.usage_extra}
    message = {**anthropic_body(reply, model), "content": [], "stop_reason": None}
    deltas = [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": c}}
        for c in (reply.chunks if reply.chunks is not None else _pieces(reply.text))
    ]
    events = [
        {"type": "message_start", "message": {**message, "usage": start_usage}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *deltas,
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        },
    ]
    return events if reply.stream_as == "final" else [*events, {"type": "message_stop"}]


@dataclass
class Recorded:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: Any


def openai_body(reply: Reply, model: str) -> dict[str, Any]:
    """A chat-completion response body."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
            **reply.usage_extra,
        },
    }


def anthropic_body(reply: Reply, model: str) -> dict[str, Any]:
    """A Messages API response body."""
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": reply.text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
            **reply.usage_extra,
        },
    }


def error_body(flavour: Flavour, status: int, message: str) -> dict[str, Any]:
    """A vendor-shaped error body."""
    if flavour == "anthropic":
        return {"type": "error", "error": {"type": "api_error", "message": message}}
    return {"error": {"message": message, "type": "server_error", "code": status}}


def body_text(body: Any) -> str:
    """A recorded body as searchable text: JSON with non-ASCII kept as is."""
    return body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)


def _blocks_text(blocks: Any) -> str:
    """The text of a list of content blocks (``[{"type": "text", "text": ...}]``)."""
    return "".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))


class FakeLLMServer:
    """A scriptable OpenAI- or Anthropic-compatible server on 127.0.0.1."""

    def __init__(self, flavour: Flavour) -> None:
        self.flavour = flavour
        self.requests: list[Recorded] = []
        self._queue: deque[Reply] = deque()
        self._forever: Reply | None = None
        self._routes: list[tuple[str, deque[Reply]]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """What to put in ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``."""
        root = f"http://127.0.0.1:{self.port}"
        return f"{root}/v1" if self.flavour == "openai" else root

    def start(self) -> FakeLLMServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; delayed replies are abandoned at once."""
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def push(self, *replies: Reply) -> None:
        """Queue replies, served in order."""
        with self._cond:
            self._queue.extend(replies)

    def forever(self, reply: Reply | None) -> None:
        """The reply served whenever the queue is empty (None: a default success)."""
        with self._cond:
            self._forever = reply

    def route(self, needle: str, reply: Reply, *then: Reply) -> None:
        """Answer every request whose body contains ``needle`` (first matching route wins).

        With ``then``, the first such request gets ``reply``, the next ones the
        replies of ``then`` in order, and the last reply is repeated after that.
        """
        with self._cond:
            self._routes.append((needle, deque([reply, *then])))

    def bodies(self) -> list[Any]:
        """The JSON bodies received so far."""
        with self._cond:
            return [r.body for r in self.requests]

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        """Wait until at least ``count`` requests arrived (bounded)."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.requests) >= count, timeout)

    def wait_for_text(self, needle: str, timeout: float = 10.0) -> bool:
        """Wait (bounded) until some request body contains ``needle``."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._matching(needle)), timeout)

    def matching(self, needle: str) -> list[int]:
        """Indexes (arrival order) of the requests whose body contains ``needle``."""
        with self._cond:
            return self._matching(needle)

    def _matching(self, needle: str) -> list[int]:
        return [i for i, r in enumerate(self.requests) if needle in body_text(r.body)]

    def user_text(self, body: Any) -> str:
        """The content of the last (user) turn of a recorded request body."""
        content = body["messages"][-1]["content"]
        return content if isinstance(content, str) else _blocks_text(content)

    def system_text(self, body: Any) -> str:
        """The system prompt of a recorded request body ("" when it has none)."""
        if self.flavour == "anthropic":
            system = body.get("system") or ""
            return system if isinstance(system, str) else _blocks_text(system)
        return "\n\n".join(
            m["content"] if isinstance(m["content"], str) else _blocks_text(m["content"])
            for m in body["messages"]
            if m.get("role") == "system"
        )

    def _next(self, recorded: Recorded) -> Reply:
        with self._cond:
            self.requests.append(recorded)
            self._cond.notify_all()
            text = body_text(recorded.body)
            for needle, replies in self._routes:
                if needle in text:
                    return replies.popleft() if len(replies) > 1 else replies[0]
            if self._queue:
                return self._queue.popleft()
            return self._forever or Reply()

    def _await_gate(self, gate: threading.Event) -> bool:
        """Hold a reply until ``gate`` is set; False if the server closed first."""
        while not gate.wait(0.02):
            if self._stop.is_set():
                return False
        return True

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self
        path_ok = "/v1/chat/completions" if self.flavour == "openai" else "/v1/messages"

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                if self.path.split("?")[0] != path_ok:
                    self._send(404, error_body(server.flavour, 404, f"no route {self.path}"), {})
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = server._next(Recorded(self.path, headers, body))
                if reply.delay and server._stop.wait(reply.delay):
                    return
                if reply.gate is not None and not server._await_gate(reply.gate):
                    return
                streamed = isinstance(body, dict) and body.get("stream")
                if streamed and reply.status < 400 and reply.stream_as != "json":
                    model = str(body.get("model", "?"))
                    self._stream(reply, model)
                    return
                if reply.body is not None:
                    payload: object = reply.body
                elif reply.status >= 400:
                    payload = error_body(server.flavour, reply.status, f"scripted {reply.status}")
                else:
                    model = body.get("model", "?") if isinstance(body, dict) else "?"
                    build = openai_body if server.flavour == "openai" else anthropic_body
                    payload = build(reply, model)
                self._send(reply.status, payload, reply.headers, reply.content_type)

            def _send(
                self,
                status: int,
                payload: object,
                headers: dict[str, str],
                content_type: str | None = "application/json",
            ) -> None:
                data = (
                    payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                )
                try:
                    self.send_response(status)
                    if content_type is not None:
                        self.send_header("content-type", content_type)
                    self.send_header("content-length", str(len(data)))
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timeout test): nothing to report

            def _stream(self, reply: Reply, model: str) -> None:
                build = openai_events if server.flavour == "openai" else anthropic_events
                events = build(reply, model)
                sent = 0
                self.protocol_version = "HTTP/1.1"  # chunked: a cut is visible as one
                try:
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("transfer-encoding", "chunked")
                    # The connection is closed after this reply: said so, or the client
                    # keeps it for its next request and may send that request before the
                    # close arrives ("Server disconnected without sending a response").
                    self.send_header("connection", "close")
                    self.end_headers()
                    for event in events:
                        is_delta = _is_text_delta(event)
                        if is_delta and reply.cut_after is not None and sent >= reply.cut_after:
                            self.wfile.flush()
                            self.close_connection = True
                            return  # no terminating chunk: the body is cut
                        held = is_delta and reply.hold is not None and sent == reply.hold_after
                        if held and not server._await_gate(reply.hold):  # type: ignore[arg-type]
                            return
                        self._chunk(_sse(server.flavour, event))
                        sent += is_delta
                    if reply.stream_as == "final" and reply.cut_at_end:
                        self.wfile.flush()
                        self.close_connection = True
                        return  # the final event sent, the body never terminated
                    if server.flavour == "openai" and reply.stream_as != "final":
                        self._chunk(b"data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass
                if reply.linger:
                    server._stop.wait(reply.linger)
                self.close_connection = True

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _is_text_delta(event: dict[str, Any]) -> bool:
    if event.get("type") == "content_block_delta":
        return True
    choices = event.get("choices") or []
    return bool(choices) and "content" in choices[0].get("delta", {})


def _sse(flavour: Flavour, event: dict[str, Any]) -> bytes:
    data = json.dumps(event)
    if flavour == "anthropic":
        return f"event: {event['type']}\ndata: {data}\n\n".encode()
    return f"data: {data}\n\n".encode()


# --------------------------------------------------------------------- agent CLIs

_AGENT_SCRIPT = r'''#!{python}
"""Fake agent CLI for steerflow tests (config: {config})."""
import json, os, pathlib, signal, subprocess, sys

sys.path.insert(0, {tests!r})
from waiting import wait_until  # bounded waits on a condition, as the tests use

cfg = json.loads(pathlib.Path({config!r}).read_text())
stdin = sys.stdin.read()
for needle, overrides in cfg.get("when", []):
    if needle in stdin:
        cfg.update(overrides)
        break
record = {{"argv": sys.argv, "cwd": os.getcwd(), "stdin": stdin, "pid": os.getpid()}}
for rel, content in cfg.get("artifacts", {{}}).items():
    target = pathlib.Path(rel)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
if "--output-last-message" in sys.argv and "last_message" in cfg:
    out = sys.argv[sys.argv.index("--output-last-message") + 1]
    pathlib.Path(out).write_text(cfg["last_message"])
if cfg.get("ignore_term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if cfg.get("grandchild"):
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    record["grandchild"] = child.pid
with open({log!r}, "a") as fh:
    fh.write(json.dumps(record) + "\n")
if cfg.get("wait_for"):  # held until the test creates this file (at most 60 s)
    wait_until(lambda: os.path.exists(cfg["wait_for"]), timeout=60, what=cfg["wait_for"])
if cfg.get("hang"):
    while True:  # hung until a signal kills it (pause returns after a handled one)
        signal.pause()
for index, line in enumerate(cfg.get("lines", [])):  # printed one by one, flushed
    if cfg.get("hold_file") and index == cfg.get("hold_after", 1):
        wait_until(lambda: os.path.exists(cfg["hold_file"]), timeout=60, what=cfg["hold_file"])
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
sys.stdout.write(cfg.get("stdout", ""))
sys.stderr.write(cfg.get("stderr", ""))
sys.exit(cfg.get("exit", 0))
'''


@dataclass
class FakeAgent:
    """A fake agent executable and the files it uses."""

    path: Path
    config: Path
    log: Path

    def configure(self, **cfg: Any) -> None:
        """Set what the next runs do (see the script for keys).

        ``when=[[needle, {key: value}], ...]``: the first needle found in the
        prompt (stdin) merges its keys over the others for that run.
        """
        self.config.write_text(json.dumps(cfg))

    def runs(self) -> list[dict[str, Any]]:
        """One record per run so far."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]


def write_fake_agent(directory: Path, name: str) -> FakeAgent:
    """Write an executable fake agent named ``name`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    agent = FakeAgent(path=path, config=directory / f"{name}.json", log=directory / f"{name}.log")
    agent.configure()
    path.write_text(
        _AGENT_SCRIPT.format(
            python=sys.executable,
            config=str(agent.config),
            log=str(agent.log),
            tests=str(Path(__file__).resolve().parents[1]),
        )
    )
    path.chmod(0o755)
    return agent


def pid_gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (absent, or a zombie awaiting its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    """Wait (bounded) until ``pid`` is gone."""
    try:
        return wait_until(lambda: pid_gone(pid), timeout=timeout, what=f"pid {pid} to exit")
    except AssertionError:
        return False
