"""Installed-looking distributions for the provider plugin tests (issue 29 item 3).

``importlib.metadata`` finds a distribution by its ``*.dist-info`` directory on ``sys.path``,
so a directory holding one (METADATA, entry_points.txt) and the module it names, put on a
child's ``PYTHONPATH``, is found by the real entry point machinery without installing
anything into the test venv.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "steerflow-provider-example"
GROUP = "steerflow.providers"


def fake_dist(
    root: Path,
    name: str,
    points: dict[str, str],
    modules: dict[str, str] | None = None,
) -> Path:
    """Write distribution ``name`` (entry points ``points`` in the steerflow group) and
    ``modules`` (module name -> source) under ``root``; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n", encoding="utf-8"
    )
    lines = [f"[{GROUP}]"] + [f"{k} = {v}" for k, v in points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for module, source in (modules or {}).items():
        (root / f"{module}.py").write_text(source, encoding="utf-8")
    return root


def example_dist(root: Path) -> list[Path]:
    """The shipped example as if installed: its metadata under ``root``, its package from
    ``examples/``; the ``PYTHONPATH`` entries to use."""
    fake_dist(
        root, "steerflow-provider-example", {"shout": "steerflow_provider_example:make_provider"}
    )
    return [root, EXAMPLE / "src"]
