"""Issue 44 class 1: mined pools were keyed on the KB's URL checksum alone, so pools (their article facts, section
indexes) mined before the KB text was edited under the same URLs were used without a word."""

from __future__ import annotations

import json

import pytest

from qkvqa.errors import StaleArtifactError
from qkvqa.qff.mining import PoolFile, articles_path


def test_pools_mined_over_another_version_of_the_kb_text_are_refused(tmp_path):
    pools = tmp_path / "hardneg_train.json"
    pools.write_text(json.dumps({"a.jpg": {"top_20": [{"entry": "u1", "similarity": 0.5}]}}))
    kb = {"url_checksum": "sha256:urls", "articles": 1, "content": "old-text-sha256"}
    facts = {"u1": {"title": "T", "image": None, "sections": [0], "num_sections": 1}}
    articles_path(pools).write_text(json.dumps({"kb": kb, "articles": facts}))
    PoolFile(pools, kb_checksum="sha256:urls", kb_content="old-text-sha256")  # the same KB: read
    with pytest.raises(StaleArtifactError, match="mined over another version of the KB"):
        PoolFile(pools, kb_checksum="sha256:urls", kb_content="new-text-sha256")
