"""The live-output files (issue 31, decision 190): bounded, head and tail kept, private,
read incrementally by a cursor while the writer thread rolls segments."""

from __future__ import annotations

import os
import random
import stat
import threading
import time
from collections import Counter
from pathlib import Path

from steerflow._live import LiveCursor, LiveWriter, live_dir, max_bytes_from_env
from waiting import wait_until


def _total(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.txt"))


def test_a_long_stream_keeps_its_head_and_tail_within_the_bound(tmp_path: Path) -> None:
    writer = LiveWriter(tmp_path, max_bytes=4096)
    emit = writer.sink("n")
    assert emit is not None
    lines = [f"line {i:05d}\n" for i in range(2000)]  # 22,000 bytes
    for line in lines:
        emit(line)
    writer.end("n")
    writer.close()
    directory = live_dir(tmp_path, "n")
    assert _total(directory) <= 4096
    assert (directory / "end").exists()
    head = (directory / "0.txt").read_text()
    assert head == "".join(lines)[:2048]  # the first half, exactly
    cursor = LiveCursor(directory)
    text = cursor.read()
    cursor.close()
    assert text.startswith(head)
    assert text.endswith("".join(lines)[-1024:])  # at least the last segment
    assert "output not kept" in text
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_a_cursor_sees_every_byte_once_across_segment_rolls(tmp_path: Path) -> None:
    writer = LiveWriter(tmp_path, max_bytes=1 << 20)
    emit = writer.sink("n")
    assert emit is not None
    cursor = LiveCursor(live_dir(tmp_path, "n"))
    seen = []
    sent = []
    for i in range(300):
        chunk = f"{i}:é€😀|"  # multi-byte characters split across writes and segments
        sent.append(chunk)
        emit(chunk)
        if i % 37 == 0:
            writer.close()  # flushes; the next emit starts the thread again
            seen.append(cursor.read())
    writer.end("n")
    writer.close()
    seen.append(cursor.read())
    assert cursor.ended
    assert "".join(seen) == "".join(sent)


def test_rolled_segments_are_read_in_order_by_a_slow_reader(tmp_path: Path) -> None:
    writer = LiveWriter(tmp_path, max_bytes=4096)  # head 2048, segments of 1024
    emit = writer.sink("n")
    assert emit is not None
    cursor = LiveCursor(live_dir(tmp_path, "n"))
    data = "".join(f"{i:04d}" for i in range(700))  # 2,800 bytes: head + one roll
    emit(data)
    writer.close()
    assert cursor.read() == data[:2800]
    assert sorted(os.listdir(live_dir(tmp_path, "n"))) == ["0.txt", "1.txt", "end"]


def test_the_size_knob(tmp_path: Path) -> None:
    assert max_bytes_from_env({}) == 1 << 20
    assert max_bytes_from_env({"STEERFLOW_LIVE_MAX_BYTES": "0"}) == 0
    assert max_bytes_from_env({"STEERFLOW_LIVE_MAX_BYTES": "10"}) == 4096
    assert max_bytes_from_env({"STEERFLOW_LIVE_MAX_BYTES": "nope"}) == 1 << 20
    assert LiveWriter(tmp_path, max_bytes=0).sink("n") is None


def _writer_calls(run: object) -> Counter[str]:
    """The C functions the writer thread called while ``run()`` ran (its profile hook)."""
    calls: Counter[str] = Counter()

    def hook(frame: object, event: str, arg: object) -> None:
        if event == "c_call" and threading.current_thread().name == "live-writer":
            calls[getattr(arg, "__qualname__", "?")] += 1

    threading.setprofile(hook)
    try:
        run()  # type: ignore[operator]
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    return calls


def test_a_steady_stream_costs_the_loop_no_wake_ups_and_a_node_few_syscalls(
    tmp_path: Path,
) -> None:
    """Decision 196: what the loop's thread pays for live output is its own work per
    chunk and the GIL round trips of the writer thread, one per syscall or wake-up, so
    they are counted here. Chunks reach the writer through a list, not one queue item
    each; while they keep coming it sleeps on its own timer and never blocks on the queue
    (a blocked writer is one the loop must wake); a node costs a ``mkdir``, an ``open``,
    a ``close`` and one ``mknod`` for its end mark, plus one ``write`` per tick."""
    nodes = [f"n{i}" for i in range(20)]
    writer = LiveWriter(tmp_path, max_bytes=1 << 20)
    sinks = [writer.sink(key) for key in nodes]

    def stream() -> None:
        deadline = time.monotonic() + 0.3  # about 15 ticks of chunks every 2 ms
        while time.monotonic() < deadline:
            for emit in sinks:
                assert emit is not None
                emit("chunk\n")
            time.sleep(0.002)
        for key in nodes:
            writer.end(key)
        writer.close()

    calls = _writer_calls(stream)
    ticks = calls["sleep"]
    assert ticks >= 5, calls
    assert calls["SimpleQueue.get"] <= 2, calls  # blocked once at the start (and maybe once idle)
    # No queue item per chunk: a stream's first chunk and its end, one empty look a tick.
    assert calls["SimpleQueue.get_nowait"] <= 2 * len(nodes) + ticks + 2, calls
    for name in ("open", "close", "mknod"):
        assert calls[name] == len(nodes), (name, calls)
    assert calls["mkdir"] == len(nodes) + 1, calls  # the live/ root once
    assert calls["stat"] == 0, calls
    assert calls["write"] <= len(nodes) * (ticks + 1), calls
    for key in nodes:
        directory = live_dir(tmp_path, key)
        text = (directory / "0.txt").read_text()
        assert text and text == "chunk\n" * (len(text) // 6)
        end = directory / "end"
        assert stat.S_ISREG(end.lstat().st_mode) and stat.S_IMODE(end.lstat().st_mode) == 0o600


def test_an_end_mark_is_never_made_through_a_symlink(tmp_path: Path) -> None:
    writer = LiveWriter(tmp_path, max_bytes=1 << 20)
    emit = writer.sink("n")
    assert emit is not None
    emit("x")
    segment = live_dir(tmp_path, "n") / "0.txt"
    wait_until(segment.exists, timeout=10, what="the first write")
    target = tmp_path / "elsewhere"
    (live_dir(tmp_path, "n") / "end").symlink_to(target)
    writer.end("n")
    writer.close()
    assert not target.exists()
    assert (live_dir(tmp_path, "n") / "0.txt").read_text() == "x"


def test_a_chunk_after_the_writer_went_idle_wakes_it(tmp_path: Path) -> None:
    writer = LiveWriter(tmp_path, max_bytes=1 << 20)
    emit = writer.sink("n")
    assert emit is not None
    segment = live_dir(tmp_path, "n") / "0.txt"
    emit("a")
    wait_until(lambda: segment.exists() and segment.read_text() == "a", timeout=10, what="a")
    wait_until(lambda: writer._idle, timeout=10, what="the writer idle")  # blocked on its queue
    emit("b")
    wait_until(lambda: segment.read_text() == "ab", timeout=10, what="b, written once woken")
    writer.end("n")
    writer.close()
    assert (live_dir(tmp_path, "n") / "end").exists()


def test_every_chunk_lands_once_in_order_whatever_the_writer_is_doing(tmp_path: Path) -> None:
    """The loop appends while the writer takes prefixes, sleeps, goes idle and is woken:
    pauses of 0 to 30 ms between chunks put emits on every side of a tick and of the idle
    flag; every node's file must still be its chunks, in order, each once."""
    rng = random.Random(31)
    writer = LiveWriter(tmp_path, max_bytes=1 << 20)
    keys = [f"n{i}" for i in range(12)]
    sinks = {key: writer.sink(key) for key in keys}
    sent: dict[str, list[str]] = {key: [] for key in keys}
    for step in range(400):
        key = rng.choice(keys)
        chunk = f"{key}:{step}|"
        emit = sinks[key]
        assert emit is not None
        emit(chunk)
        sent[key].append(chunk)
        if rng.random() < 0.1:
            time.sleep(rng.choice([0.0, 0.001, 0.019, 0.021, 0.03]))
    for key in keys:
        writer.end(key)
    writer.close()
    for key in keys:
        directory = live_dir(tmp_path, key)
        assert (directory / "0.txt").read_text() == "".join(sent[key]), key
        assert (directory / "end").exists()


def test_end_says_whether_the_call_will_get_an_end_mark(tmp_path: Path) -> None:
    """Decision 235: a reader told a node ended waits for the mark only when end() was true."""
    writer = LiveWriter(tmp_path, max_bytes=4096)
    talk, silent = writer.sink("talk"), writer.sink("silent")
    assert talk is not None and silent is not None
    talk("said\n")
    assert writer.end("talk") is True
    assert writer.end("silent") is False
    assert writer.end("never-called") is False
    writer.close()
    assert (live_dir(tmp_path, "talk") / "end").exists()
    assert not live_dir(tmp_path, "silent").exists()  # no directory, no mark (decision 190)
    off = LiveWriter(tmp_path / "off", max_bytes=0)
    assert off.sink("n") is None
    assert off.end("n") is False
