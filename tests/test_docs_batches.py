"""``docs/batches.md``'s Python batch, run as a user would paste it (issue 43).

Its one ```python block runs in its own interpreter with a fresh ``STEERFLOW_HOME``, at 300
documents instead of 10,000 (the only change): the reducer's reply holds every document's,
read back from the version 4 checkpoint the run wrote.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "batches.md"

pytestmark = pytest.mark.timeout(120)


def test_the_batch_in_the_guide_runs_on_version_4(tmp_path: Path) -> None:
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert "range(10_000)" in block
    script = tmp_path / "batch.py"
    script.write_text(block.replace("range(10_000)", "range(300)"), encoding="utf-8")
    env = {**os.environ, "STEERFLOW_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[echo report]\nMerge.")
    assert all(f"### doc-{i} (completed)\n[echo doc-{i}]" in done.stdout for i in (0, 299))
    (manifest,) = (tmp_path / "home" / "runs").glob("*/checkpoint.json")
    assert json.loads(manifest.read_text())["version"] == 4
