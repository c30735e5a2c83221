"""The append-only prediction parts of an evaluation: a row torn by a kill is cut before the next append."""

from __future__ import annotations

import json

from qkvqa.pipeline.predictions import PredictionStore, cut_torn_tail


def test_a_row_torn_by_a_kill_is_cut_and_its_question_answered_again(tmp_path):
    """Issue 15 item 8: the next append was glued onto the torn line, and resume then failed for good."""
    store = PredictionStore(tmp_path)
    store.append(0, [{"data_id": "a", "prediction": "x"}, {"data_id": "b", "prediction": "y"}])
    with open(store.part(0), "ab") as f:
        f.write(b'{"data_id": "c", "predic')  # killed mid-write
    assert store.done_ids() == {"a", "b"}  # the torn row counts as not answered
    store.append(0, [{"data_id": "c", "prediction": "z"}])
    assert [json.loads(line)["data_id"] for line in store.part(0).read_text().splitlines()] == ["a", "b", "c"]
    assert store.merge(["a", "b", "c"])[2]["prediction"] == "z"
    assert cut_torn_tail(store.part(0)) == 0  # a whole file is left alone
    store.part(0).write_bytes(b'{"data_id": "a"')  # torn first row: nothing kept
    assert cut_torn_tail(store.part(0)) == 15 and store.part(0).read_bytes() == b""
