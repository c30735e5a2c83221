"""Issue 34 item 5, the demo: its world's location and the command that reuses it without re-embedding are stated;
the world's deliberately missing images are warned once per demo, not once per evaluation."""

from __future__ import annotations

import logging
import shlex

import pytest

from qkvqa.config.load import compose
from qkvqa.demo.run import Demo, OncePerRun
from qkvqa.retrieval.retrieve import expected_encoders


@pytest.mark.slow
def test_the_reuse_command_reads_the_demos_world_caches_and_qff(tmp_path):
    demo = Demo(tmp_path / "demo", tmp_path / "runs", entities=36, seed=3)
    tokens = shlex.split(demo.reuse_command())
    assert tokens[:3] == ["qkvqa", "evaluate", "experiment=demo/evaluate"]
    mine = compose("demo/evaluate", [], tokens[3:])
    ran = compose("demo/evaluate", [], [*demo.common, "run_id=demo-embed"])  # what the demo embedded with
    assert mine.paths.world_dir == str(tmp_path / "demo" / "world") == ran.paths.world_dir
    assert mine.paths.cache_dir == ran.paths.cache_dir and mine.seed == ran.seed == 3
    assert mine.data.kb_store == ran.data.kb_store and expected_encoders(mine) == expected_encoders(ran)
    assert mine.qff.checkpoint == str(tmp_path / "runs" / "demo-qff-per_layer" / "qff")


def test_a_warning_repeated_by_each_evaluation_is_shown_once():
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger("qkvqa.test_first_day_demo")
    handler = Keep()
    handler.addFilter(OncePerRun())
    logger.addHandler(handler)
    try:
        for _ in range(4):  # four evaluations of the same world
            logger.warning("skipping landmarks image %s (corrupt): %s", "66cd", "/w/66cd.jpg")
            logger.warning("skipping inaturalist image %s (missing): %s", "a1b2", "/w/a1b2.jpg")
            logger.info("evaluating 42 questions")
    finally:
        logger.removeHandler(handler)
    assert lines.count("skipping landmarks image 66cd (corrupt): /w/66cd.jpg") == 1
    assert lines.count("skipping inaturalist image a1b2 (missing): /w/a1b2.jpg") == 1
    assert lines.count("evaluating 42 questions") == 4  # information is not deduplicated
