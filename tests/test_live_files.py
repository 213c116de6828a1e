"""The live-output files (issue 31, decision 190): bounded, head and tail kept, private,
read incrementally by a cursor while the writer thread rolls segments."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from steerflow._live import LiveCursor, LiveWriter, live_dir, max_bytes_from_env


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
