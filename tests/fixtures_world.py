"""A small synthetic world for tests: `make_world(tmp_dir)` (wire it into a session fixture in conftest.py)."""

from __future__ import annotations

from pathlib import Path

from qkvqa.synth.world import generate_world

SMALL_WORLD_ENTITIES = 36


def make_world(tmp_dir: str | Path, entities: int = SMALL_WORLD_ENTITIES, seed: int = 0) -> dict:
    """Generate a synthetic world under `tmp_dir/world` (about a second) and return world.json with `dir` added."""
    out = Path(tmp_dir) / "world"
    manifest = generate_world(out, entities=entities, seed=seed)
    manifest["dir"] = str(out)
    return manifest
