"""The MLLM-filtering baseline (appendix 6.5) shows the VLM the query image and each candidate article's image."""

from __future__ import annotations

import pytest
from PIL import Image

from qkvqa.cda.select import RankedArticle
from qkvqa.config.schema import GenerationConfig
from qkvqa.data.images import ArticleImage, ArticleImageIndex
from qkvqa.data.kb import Article
from qkvqa.generation.backends import build_generator
from qkvqa.pipeline.mllm_filter import MLLMFilterSelector


def article(row: int, title: str) -> Article:
    return Article(
        row, f"https://en.wikipedia.org/wiki/{title}", title, [title, "Diet"], ["A bird.", "It eats fish."], [], [], []
    )


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_each_filter_prompt_carries_the_query_and_the_candidate_image(tmp_path):
    heron_image = tmp_path / "heron.jpg"
    Image.new("RGB", (40, 30), "grey").save(heron_image)
    images = ArticleImageIndex({"Grey heron": [ArticleImage(heron_image, "a heron", "u")]})
    generator = build_generator(
        {"kind": "qwen2_5_vl", "tiny": True, "device": "cpu"}, GenerationConfig(max_new_tokens=3, batch_size=2)
    )
    seen = []
    real_run = generator.runner.run

    def recording_run(texts, image_lists, *args):  # the real tiny VLM runs; we only look at its inputs
        seen.extend(image_lists)
        return real_run(texts, image_lists, *args)

    generator.runner.run = recording_run
    ranked = [
        RankedArticle(article(0, "Grey heron"), 0.9, {0: 0.5}),
        RankedArticle(article(1, "Kestrel"), 0.8, {0: 0.4}),
    ]
    query = Image.new("RGB", (32, 32), "red")
    context = MLLMFilterSelector(generator, top_n=5, article_images=images).select("what does it eat?", ranked, query)
    assert context.mode == "mllm_filter" and context.kept_articles == [0, 1]
    assert len(seen) == 2
    assert seen[0][0] is query and seen[0][1].size == (40, 30)  # the heron's own image, decoded
    assert seen[1] == [query]  # the kestrel has none: no candidate image
    assert images.titles_without_image == {"Kestrel"}
