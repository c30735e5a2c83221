"""Issue 44 class 2: a component of one role in another's slot is refused when the config is composed, in one line
naming the key (it was a traceback after stage 1 and the QFF had run)."""

from __future__ import annotations

import pytest

from qkvqa.config.load import compose
from qkvqa.errors import ConfigError


@pytest.mark.parametrize(
    "override, message",
    [
        ("components.reranker.kind=bem", r"components.reranker.kind='bem' is a judge component, not a reranker"),
        ("components.generator.kind=bge_reranker", r"components.generator.kind='bge_reranker' is a reranker compon"),
        ("components.text_encoder.kind=timm_image", r"components.text_encoder.kind='timm_image' is a image_encoder"),
    ],
)
def test_a_kind_of_another_role_is_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        compose(None, [], [override])


def test_every_shipped_kind_in_its_own_slot_composes():
    compose(None, [], ["components.reranker.kind=sentence_transformer", "components.generator.kind=chat_lm"])
