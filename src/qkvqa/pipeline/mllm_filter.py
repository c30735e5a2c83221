"""The MLLM-filtering baseline (paper Table 2, appendix 6.5): the VLM reads each top-N article, the answers
are merged into the context. It replaces QFF + CDA as the context selector."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from qkvqa.cda.select import Context, RankedArticle
from qkvqa.generation.prompts import filter_prompts, merge_filter_outputs


class MLLMFilterSelector:
    """Context = the generator's filtered outputs over the first `top_n` ranked articles.

    Each prompt shows the query image and the candidate article's main image (appendix 6.5), from
    `article_images` (a `qkvqa.data.images.ArticleImageIndex`); an article without one gets no image.
    """

    mode = "mllm_filter"

    def __init__(self, generator: Any, top_n: int = 5, article_images: Optional[Any] = None):
        self.generator = generator
        self.top_n = int(top_n)
        self.article_images = article_images

    def select(self, question: str, ranked_articles: Sequence[RankedArticle], image: Optional[Any] = None) -> Context:
        """Run one filtering prompt per article (batched) and merge the non-empty outputs."""
        articles = [ranked.article for ranked in ranked_articles[: self.top_n]]
        candidate_images = [
            self.article_images.load_main_image(a.title, a.image_urls) if self.article_images is not None else None
            for a in articles
        ]
        outputs = self.generator.generate_prompts(
            filter_prompts(question, image, articles, candidate_images, top_n=self.top_n)
        )
        text = merge_filter_outputs(outputs)
        return Context(
            mode=self.mode,
            chunks=[],
            text=text,
            token_count=self.generator.count_tokens(text) if text else 0,
            kept_articles=list(range(len(articles))),
        )
