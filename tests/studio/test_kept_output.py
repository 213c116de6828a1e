"""An ended node's page keeps its whole stream (decision 396).

The live writer appends a call's last chunks on its own tick, after the node may be
published ``completed`` (decision 235); the page rendered on that status is not polled
again, so it waits, bounded, for the writer's end mark. The writer here is the real
:class:`LiveWriter` (its thread, its files); the hold between the page's first read and
the last append is made deterministic by doing the append inside that first read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from steerflow._live import LiveWriter, live_dir
from steerflow.studio import _node_live


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _streamed(run_dir: Path, text: str) -> tuple[LiveWriter, Callable[[str], None]]:
    writer = LiveWriter(run_dir)
    emit = writer.sink("s")
    assert emit is not None
    emit(text)
    wait_for(lambda: (live_dir(run_dir, "s") / "0.txt").exists(), "the first chunk on disk")
    wait_for(lambda: _node_live.kept_output(run_dir, "s").text == text, "the first chunk readable")
    return writer, emit


def test_an_ended_node_waits_for_the_writers_last_chunk_and_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, emit = _streamed(tmp_path, "first line\n")
    reads: list[_node_live.KeptOutput] = []
    plain = _node_live.kept_output

    def read_then_finish(run_dir: Path, node_key: str) -> _node_live.KeptOutput:
        kept = plain(run_dir, node_key)
        if not reads:  # the node is published ended; its last chunk lands after this read
            emit("last line\n")
            writer.end("s")
            wait_for(lambda: (live_dir(tmp_path, "s") / "end").exists(), "the end mark")
        reads.append(kept)
        return kept

    monkeypatch.setattr(_node_live, "kept_output", read_then_finish)
    kept = _node_live.kept_output_whole(tmp_path, "s", run_running=True)
    writer.close()
    assert reads[0].text == "first line\n" and not reads[0].ended
    assert (kept.text, kept.ended) == ("first line\nlast line\n", True)


def test_without_a_mark_coming_the_page_does_not_wait(tmp_path: Path) -> None:
    writer, _ = _streamed(tmp_path, "only line\n")
    # The run is not running (its writer is closed or died): what is on disk is all.
    kept = _node_live.kept_output_whole(tmp_path, "s", run_running=False)
    assert (kept.text, kept.ended) == ("only line\n", False)
    writer.close()
    # A node that streamed nothing has no files and nothing to wait for.
    empty = _node_live.kept_output_whole(tmp_path, "silent", run_running=True)
    assert (empty.text, empty.ended) == ("", False)


def test_a_mark_that_never_comes_is_waited_for_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, _ = _streamed(tmp_path, "stuck\n")
    monkeypatch.setattr(_node_live, "END_MARK_WAIT_S", 0.1)
    reads = 0
    plain = _node_live.kept_output

    def counted(run_dir: Path, node_key: str) -> _node_live.KeptOutput:
        nonlocal reads
        reads += 1
        return plain(run_dir, node_key)

    monkeypatch.setattr(_node_live, "kept_output", counted)
    kept = _node_live.kept_output_whole(tmp_path, "s", run_running=True)
    writer.close()
    assert (kept.text, kept.ended) == ("stuck\n", False)
    assert reads >= 2  # it read again while waiting, and then gave up: the call returned
