"""Cross-question QFF scoring: a batch of questions scores as each question alone; the article ViT-state LRU."""

from __future__ import annotations

import pytest
import torch

from qkvqa.qff.builder import SectionRequest
from tests.unit.test_qff_attention import _image
from tests.unit.test_qff_model import QUESTIONS, SECTIONS, tiny

TOLERANCE = 1e-5


pytestmark = pytest.mark.usefixtures("single_thread")


def requests():
    """Three questions over overlapping articles (a, b shared), one article without an image, one without sections."""
    images = {"a": _image(10), "b": _image(11), "c": _image(12)}
    return [
        SectionRequest(
            "what is the wingspan of this bird?",
            _image(1),
            [images["a"], images["b"], None],
            [SECTIONS[:2], SECTIONS[2:], SECTIONS[:1]],
        ),
        SectionRequest("when was this landmark built?", _image(2), [images["b"], images["c"]], [SECTIONS[2:], []]),
        SectionRequest("what does it eat?", _image(3), [_image(10)], [SECTIONS]),  # a again, as a new object
    ]


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("section_batch_size", [2, 64])
def test_a_batch_of_questions_scores_as_each_question_alone(attention, section_batch_size):
    comp = tiny(focus="per_layer", attention=attention, section_batch_size=section_batch_size, vit_lru_size=0)
    comp.model.q_gate.fill_(0.6)  # open: every question's own states matter
    alone = [comp.score_sections(r.question, r.image, r.article_images, r.article_sections) for r in requests()]
    together = comp.score_sections_many(requests())
    assert [[len(s) for s in q] for q in together] == [[2, 1, 0], [1, 0], [3]]
    for a, b in zip(alone, together):
        for sa, sb in zip(a, b):
            assert max([abs(x - y) for x, y in zip(sa, sb)], default=0.0) <= TOLERANCE
    # (that each section meets its own question is asserted on the states, whose differences are not saturated by
    # the tiny model's cosine: test_qff_attention::test_each_section_meets_the_question_question_index_names)


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("size", [1, 2])
def test_article_vit_states_are_reused_across_questions_and_calls(size):
    comp = tiny(focus="per_layer", vit_lru_size=size)
    reference = tiny(focus="per_layer", vit_lru_size=0).score_sections_many(requests())
    first = comp.score_sections_many(requests())
    # a and b are looked up (shared by two questions, encoded once); c has no sections and x no image: never
    assert comp.vit_cache_stats == {"hits": 0, "misses": 2} and len(comp._vit_cache) == size
    second = comp.score_sections_many(requests())
    # size 2: both are hits; size 1: b (kept) is a hit, a was evicted and is encoded again
    assert comp.vit_cache_stats == ({"hits": 2, "misses": 2} if size == 2 else {"hits": 1, "misses": 3})
    assert comp.vit_cache_hit_rate() == pytest.approx(comp.vit_cache_stats["hits"] / 4)
    assert second == first  # the cached states are the same states, exactly
    for a, b in zip(first, reference):  # and the ViT batched or not: the same up to rounding
        for sa, sb in zip(a, b):
            assert max([abs(x - y) for x, y in zip(sa, sb)], default=0.0) <= TOLERANCE


@pytest.mark.slow
@torch.no_grad()
def test_a_questions_scores_do_not_depend_on_what_earlier_questions_left_in_the_cache():
    """What a batch finds cached depends on the batches before it (another rank, a resumed run): bit for bit the
    same scores either way."""
    warm, cold = tiny(focus="per_layer"), tiny(focus="per_layer")
    batch = requests()
    warm.score_sections_many(batch[2:])  # leaves article a cached
    assert warm.score_sections_many(batch[:2]) == cold.score_sections_many(batch[:2])
    assert warm.vit_cache_stats["hits"] == 1 and cold.vit_cache_stats["hits"] == 0


@torch.no_grad()
def test_the_vit_cache_is_off_when_the_vit_is_trained():
    comp = tiny(focus="per_layer", freeze_vit=False)
    comp.score_sections_many(requests())
    assert comp.vit_cache_stats == {"hits": 0, "misses": 0} and not comp._vit_cache


@pytest.mark.gpu
@torch.no_grad()
def test_bf16_autocast_on_a_gpu_scores_close_to_fp32():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    fp32 = tiny(focus="per_layer", vit_lru_size=0)
    reference = fp32.score_sections_many(requests())
    torch.manual_seed(0)
    from qkvqa.components import build_component

    spec = {
        "kind": "blip2_qff",
        "tiny": True,
        "device": "cuda",
        "dtype": "bf16",
        "options": {"num_layers": 4, "cross_attention_frequency": 2, "vocab_texts": SECTIONS + QUESTIONS},
    }
    bf16 = build_component(spec)
    assert bf16._autocast() is not None and bf16.model.vision_dtype == torch.bfloat16
    got = bf16.score_sections_many(requests())
    for a, b in zip(reference, got):
        for sa, sb in zip(a, b):
            assert max([abs(x - y) for x, y in zip(sa, sb)], default=0.0) <= 2e-2


@torch.no_grad()
def test_in_fixed_chunks_an_images_vit_states_depend_on_that_image_alone():
    comp = tiny(focus="per_layer")
    images = [_image(20 + i) for i in range(11)]  # one full chunk of 8 and a padded one
    together = comp._encode_images(images, fixed_chunks=True)
    assert together.shape[0] == 11
    for i in (0, 7, 8, 10):
        alone = comp._encode_images([images[i]], fixed_chunks=True)[0]
        assert torch.equal(together[i], alone)


@pytest.mark.slow
@torch.no_grad()
def test_the_cache_is_keyed_on_the_pixels_and_emptied_when_the_vit_changes():
    comp = tiny(focus="per_layer")
    reference = comp.score_sections_many(requests())
    other = [
        SectionRequest(
            r.question,
            r.image,
            [_image(50 + i) if a is not None else None for i, a in enumerate(r.article_images)],
            r.article_sections,
        )
        for r in requests()
    ]  # the same articles, other pictures
    assert comp.score_sections_many(other) != reference
    with torch.no_grad():  # new ViT weights in place (as load_state_dict)
        for param in comp.model.base.vision_model.parameters():
            param.mul_(1.5)
    fresh = tiny(focus="per_layer")  # the same path (fixed ViT chunks), a cold cache
    with torch.no_grad():
        for param in fresh.model.base.vision_model.parameters():
            param.mul_(1.5)
    assert comp.score_sections_many(requests()) == fresh.score_sections_many(requests())
