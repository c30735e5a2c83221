"""The study's positive control: QFF focus plugins whose focus path is handed an oracle of what the question asks.

`AttributeOracle` and `PresenceOracle` are `qff.focus` plugins (docs/extending.md), named in config as
`qff.focus=tests.helpers.qff_oracle:PresenceOracle`, so a trained control records this file's sha256 and is scored
by the same class (a control trained before an edit of this file is refused, as any plugin's). They add no trained
weights: each runs per_layer's focus blocks on an oracle question encoding. The builder hands them the tokenizer
(`bind_tokenizer`), from which they take the attribute words' token ids; the sha256 of those ids is saved with the
weights, so a control is refused where the word list or the tokenizer has changed since it was trained.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Optional, Sequence

import torch

from qkvqa.errors import StaleArtifactError
from qkvqa.qff.model import QFFModel, QuestionEncoding

# Words too common across the questions to name an attribute (they stand in several facts' questions and sentences).
GENERIC_WORDS = {
    "the",
    "a",
    "an",
    "of",
    "and",
    "or",
    "in",
    "on",
    "at",
    "to",
    "for",
    "from",
    "by",
    "with",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "has",
    "have",
    "as",
    "off",
    "upon",
    "it",
    "its",
    "this",
    "that",
    "what",
    "which",
    "who",
    "how",
    "many",
    "much",
    "does",
    "do",
    "did",
    "can",
    "into",
    "up",
    "about",
    "each",
    "year",
    "name",
    "value",
    "person",
}


def attribute_words() -> list[str]:
    """The words that name what a synthetic-world question asks for: those its question templates share with the
    sentence that states the fact (diet, wingspan, conservation, ...), the lead facts' verbs and the two surveys."""
    from qkvqa.synth.world import CATEGORIES, SURVEYS

    def words(text: str) -> set[str]:
        return set(re.findall(r"[a-z]+", text.lower()))

    found = {"described", "completed", "visitors", "receive", *SURVEYS}
    for category in CATEGORIES.values():
        for fact in category["facts"]:
            found |= (words(fact.templated) | words(fact.automatic)) & words(fact.sentence)
    nouns = {category["noun"] for category in CATEGORIES.values()}
    return sorted(found - GENERIC_WORDS - nouns)


def oracle_token_ids(tokenizer) -> list[int]:
    """Token ids of `attribute_words` (the tiny tokenizer keeps each one whole) and of [CLS] / [SEP]."""
    ids = {tokenizer.cls_token_id, tokenizer.sep_token_id}
    for word in attribute_words():
        pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
        ids.update(pieces)
    return sorted(i for i in ids if i is not None)


class OracleQuestionEncoding(QuestionEncoding):
    """A question encoding whose focus path reads `focus_states` (the oracle's layer states) in place of its own;
    `attribute_ids` `[B, L]`: the question's attribute token ids (0 elsewhere), for the presence oracle."""

    def __init__(self, layer_states, focus_states, attribute_ids=None):
        super().__init__(layer_states)
        self.focus_states = focus_states
        self.attribute_ids = attribute_ids


def attribute_presence(section_ids, attribute_ids):
    """`[N]`: the share of a question's attribute tokens (`attribute_ids` `[N, L]`, 0 = none) that section n holds
    (`section_ids` `[N, S]`); 0 for a question without one."""
    wanted = attribute_ids > 0
    held = (attribute_ids[:, :, None] == section_ids[:, None, :]).any(dim=2) & wanted
    return held.sum(dim=1).float() / wanted.sum(dim=1).clamp(min=1).float()


class OracleFocusModel(QFFModel):
    """QFFModel whose focus blocks attend to an oracle: the question pass of the question with every token but its
    attribute words (and [CLS] / [SEP]) masked out of attention, so the section pass is told which attribute is asked
    without having to read it from the question; the question tokens that late interaction scores are the whole
    question's, as in every variant. No new weights: per_layer's focus blocks read the oracle. The config builds a
    subclass (`AttributeOracle`, `PresenceOracle`); the builder binds the tokenizer's ids (`bind_tokenizer`)."""

    FOCUS_BASE = "per_layer"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the sha256 of the token ids the oracle trained with, saved with the weights (a buffer, not a parameter)
        self.register_buffer("oracle_ids_sha256", torch.zeros(32, dtype=torch.uint8))
        self.oracle_ids: Optional[torch.Tensor] = None
        self.special_ids: Sequence[int] = ()
        self._bound_sha256: Optional[torch.Tensor] = None
        # weights loaded after the bind (Lightning's resume, load_state_dict) are checked as they load
        self.register_load_state_dict_post_hook(lambda module, _incompatible: module._check_oracle_ids())

    def bind_tokenizer(self, tokenizer) -> None:
        """Take the attribute words' and the special tokens' ids from `tokenizer`; a fresh model records their sha256,
        a trained one (its weights loaded before the bind, as the builder's checkpoint path does) must hold the same."""
        ids, special = oracle_token_ids(tokenizer), sorted(set(tokenizer.all_special_ids))
        digest = hashlib.sha256(json.dumps([ids, special]).encode()).digest()
        self._bound_sha256 = torch.tensor(list(digest), dtype=torch.uint8)
        if not self.oracle_ids_sha256.any():
            self.oracle_ids_sha256.copy_(self._bound_sha256)
        self.oracle_ids = torch.tensor(ids, dtype=torch.long)
        self.special_ids = special
        self._check_oracle_ids()

    def _check_oracle_ids(self) -> None:
        """Refuse weights trained with other oracle ids than the bound tokenizer gives (once bound; at bind and load,
        not per batch)."""
        if self._bound_sha256 is not None and not torch.equal(self.oracle_ids_sha256.cpu(), self._bound_sha256):
            raise StaleArtifactError(
                f"{type(self).__name__}: these weights were trained with other oracle token ids than the tokenizer "
                "and attribute_words() give now (tests/helpers/qff_oracle.py): retrain the control"
            )

    def encode_question(self, input_ids, attention_mask, image_states):
        if self._bound_sha256 is None:
            raise RuntimeError(
                f"{type(self).__name__}: no tokenizer bound: build it with build_qff_component (it binds one)"
            )
        whole = super().encode_question(input_ids, attention_mask, image_states)
        keep = torch.isin(input_ids, self.oracle_ids.to(input_ids.device)).to(attention_mask.dtype)
        oracle = super().encode_question(input_ids, attention_mask * keep, image_states)
        special = torch.isin(input_ids, torch.tensor(self.special_ids, device=input_ids.device))
        attribute_ids = input_ids * (keep.bool() & ~special & attention_mask.bool())
        return OracleQuestionEncoding(whole.layer_states, oracle.layer_states, attribute_ids)

    def oracle_states(self, question: OracleQuestionEncoding, section_ids, kwargs: dict) -> tuple[tuple, dict]:
        """The layer states the focus blocks read for these sections, and encode_sections' keyword arguments."""
        return question.focus_states, kwargs

    def encode_sections(self, input_ids, attention_mask, image_states, question=None, **kwargs):
        if isinstance(question, OracleQuestionEncoding) and (kwargs.get("focus") or self.focus) != "none":
            states, kwargs = self.oracle_states(question, input_ids * attention_mask, kwargs)
            question = QuestionEncoding(tuple(states))
        return super().encode_sections(input_ids, attention_mask, image_states, question, **kwargs)


class AttributeOracle(OracleFocusModel):
    """The focus blocks read the question's attribute words only (told which attribute is asked, the model must
    still find it in the section)."""


class PresenceOracle(OracleFocusModel):
    """The attribute oracle scaled per (question, section) by the share of the attribute words the section holds: the
    focus path is handed whether the section states the asked attribute (the positive control)."""

    def oracle_states(self, question, section_ids, kwargs):
        """Each section's row of the oracle states (one question broadcast, or `question_index`'s), times its share."""
        n, index = section_ids.shape[0], kwargs.get("question_index")

        def rows(t):
            return (
                t.expand(n, *t.shape[1:]) if t.shape[0] == 1 else t.index_select(0, index) if index is not None else t
            )

        share = attribute_presence(section_ids, rows(question.attribute_ids))[:, None, None]
        states = tuple(share.to(s.dtype) * rows(s) for s in question.focus_states)
        return states, {**kwargs, "question_index": None}
