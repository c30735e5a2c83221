"""Issue 47: the readings where the paper's text and its owners' code differ, as switches (qff.question_norm,
cda.theta_on, cda.chunk_length_counts): each changes what it should, the defaults are the paper's text, every stage
that reads one sees the same value, and the protocol card names them."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from qkvqa.cda.chunker import Chunker
from qkvqa.cda.select import ContextSelector, RankedArticle, select_articles, select_context, theta_scores
from qkvqa.cda.splitter import SentenceSplitter
from qkvqa.config.load import compose
from qkvqa.config.schema import CDAConfig
from qkvqa.data.sections import section_string
from qkvqa.errors import ConfigError
from qkvqa.qff.scoring import late_interaction

pytestmark = pytest.mark.usefixtures("single_thread")


def words(text: str) -> int:
    """One token per whitespace-separated word (hand-checkable counts)."""
    return len(text.split())


@pytest.fixture(scope="module")
def splitter() -> SentenceSplitter:
    return SentenceSplitter()


def world_cfg(world, *overrides: str):
    return compose("demo/evaluate", [], [f"paths.world_dir={world['dir']}", "qff.allow_untrained=true", *overrides])


# ------------------------------------------------------------------------------------------------- the schema
@pytest.mark.slow
def test_the_defaults_are_the_paper_s_text_and_a_bad_value_is_one_line_naming_the_choices():
    cfg = compose("eval/evqa_qwen", [], [])
    assert (cfg.qff.question_norm, cfg.cda.theta_on, cfg.cda.chunk_length_counts) == ("per_token", "fused", "body")
    for key, allowed in (
        ("qff.question_norm", "per_token, across_tokens"),
        ("cda.theta_on", "fused, qff, softmax"),
        ("cda.chunk_length_counts", "body, with_header"),
    ):
        with pytest.raises(ConfigError) as raised:
            compose("eval/evqa_qwen", [], [f"{key}=dim1"])
        assert str(raised.value) == f"{key}='dim1' is not one of {allowed}"


def test_the_run_record_s_config_carries_the_switches(tmp_path):
    import yaml

    from qkvqa.run.record import RunRecord

    cfg = compose(
        "eval/evqa_qwen",
        [],
        ["qff.question_norm=across_tokens", "cda.theta_on=softmax", "cda.chunk_length_counts=with_header"],
    )
    RunRecord(tmp_path).write_config(cfg)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["qff"]["question_norm"] == "across_tokens"
    assert (saved["cda"]["theta_on"], saved["cda"]["chunk_length_counts"]) == ("softmax", "with_header")


# ------------------------------------------------------------------------------------------ qff.question_norm
def _tokens(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_norm_is_invariant_to_what_it_normalises_and_the_other_is_not(seed):
    """per_token ignores each question token's length (a cosine); across_tokens, OMGM's dim=1, ignores each hidden
    channel's scale across the tokens instead."""
    question, sections = _tokens((8, 32), seed), _tokens((5, 6, 32), seed + 10)
    per, across = (late_interaction(question, sections, question_norm=n) for n in ("per_token", "across_tokens"))
    token_scale = question * torch.rand(8, 1, generator=torch.Generator().manual_seed(seed)).add(0.2)
    channel_scale = question * torch.rand(1, 32, generator=torch.Generator().manual_seed(seed)).add(0.2)
    assert torch.allclose(late_interaction(token_scale, sections), per, atol=1e-5)
    assert not torch.allclose(late_interaction(token_scale, sections, question_norm="across_tokens"), across)
    assert torch.allclose(late_interaction(channel_scale, sections, question_norm="across_tokens"), across, atol=1e-5)
    assert not torch.allclose(late_interaction(channel_scale, sections), per)
    assert per.abs().max() <= 1 + 1e-6  # a mean of cosines


@pytest.mark.parametrize("queries, hidden", [(32, 32), (8, 128), (4, 512)])
def test_across_tokens_scales_the_score_by_about_the_root_of_hidden_over_queries(queries, hidden):
    """Against its own tokens a question scores 1 per token; across tokens, each channel has unit norm over the
    queries, so a token's norm is sqrt(hidden / queries) on average and the score about that (4.9 for BLIP-2's 32
    queries of 768)."""
    question = _tokens((queries, hidden), queries)
    per = late_interaction(question, question).item()
    across = late_interaction(question, question, question_norm="across_tokens").item()
    assert per == pytest.approx(1.0, abs=1e-5)
    normalised = torch.nn.functional.normalize(question, dim=-2)
    assert normalised.pow(2).sum().item() == pytest.approx(hidden, rel=1e-4)  # each channel a unit vector
    assert 0.5 * math.sqrt(hidden / queries) <= across / per <= 1.5 * math.sqrt(hidden / queries)


def _qff_scores(world, *overrides):
    """Every article's QFF score for the first test questions with a query image, through `QFFReranker.from_config`
    (what `qkvqa rerank` and an evaluation build) over the learning test's stand-in stage 1."""
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.qff.rerank import QFFReranker
    from tests.helpers.qff_study import world_stage1

    cfg = world_cfg(world, "retrieval.top_k=5", *overrides)
    benchmark = build_benchmark(cfg.data)
    reranker = QFFReranker.from_config(cfg, benchmark)
    stage1 = world_stage1(world, "test", top_k=5)
    items = []
    for question in benchmark.questions("test"):
        image = benchmark.image_loader.load(question.dataset_name, question.image_id)
        if image is not None:
            items.append((question.question, image, stage1[question.data_id]))
        if len(items) == 3:
            break
    results = reranker.rerank_many(items)
    return reranker, [s for r in results for scores in r.section_scores for s in scores]


@pytest.mark.slow
def test_the_question_norm_reaches_rerank_evaluate_and_training_and_is_recorded(world):
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.models.qff_module import QFFTrainer
    from qkvqa.pipeline.build import build_filter
    from qkvqa.qff.rerank import reranked_provenance

    cfg = world_cfg(world, "qff.question_norm=across_tokens", "eval.split=test")
    benchmark = build_benchmark(cfg.data)
    article_filter = build_filter(cfg, benchmark)  # what an evaluation ranks with
    assert article_filter.reranker.component.question_norm == "across_tokens"
    assert reranked_provenance(cfg, article_filter.reranker, "test", benchmark)["qff.question_norm"] == "across_tokens"
    trainer = QFFTrainer(article_filter.reranker.component.model, cfg.qff)
    assert trainer.scorer.options["question_norm"] == "across_tokens"  # the validation article R@1
    default = build_filter(world_cfg(world), benchmark)
    assert default.reranker.component.question_norm == "per_token"


@pytest.mark.slow
def test_across_tokens_scores_grow_with_hidden_size_over_query_tokens_on_the_tiny_qff(world):
    """The same tiny QFF (64 hidden channels) scored both ways: the across-token scores are larger than the
    cosines by a factor that grows as the query tokens get fewer (sqrt(64 / 2) against sqrt(64 / 16))."""
    ratios = {}
    for queries in (2, 16):
        shape = f"components.qformer.options.num_query_tokens={queries}"
        _, per = _qff_scores(world, shape)
        _, across = _qff_scores(world, shape, "qff.question_norm=across_tokens")
        assert len(per) == len(across) > 0 and max(abs(s) for s in per) <= 1 + 1e-6
        ratios[queries] = sum(across) / sum(per)
    assert ratios[16] > 1 and ratios[2] > 1.5 * ratios[16], ratios


@pytest.mark.slow
def test_a_precomputed_file_is_refused_under_another_question_norm(world, tmp_path):
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.pipeline.filters import check_precomputed_provenance

    cfg = world_cfg(world)
    benchmark = build_benchmark(cfg.data)
    path = tmp_path / "reranked_test.json"
    made = {"qff.alpha": 0.9, "qff.question_norm": "across_tokens"}
    with pytest.raises(ConfigError, match="reranked with qff.question_norm=across_tokens .* set qff.question_norm="):
        check_precomputed_provenance(path, made, cfg, benchmark)
    across = world_cfg(world, "qff.question_norm=across_tokens")
    check_precomputed_provenance(path, made, across, benchmark)  # the same norm: accepted
    older = {"qff.alpha": 0.9}  # a sidecar from before the switch: scored per token
    check_precomputed_provenance(path, older, cfg, benchmark)
    with pytest.raises(ConfigError, match="qff.question_norm=per_token"):
        check_precomputed_provenance(path, older, across, benchmark)


# ------------------------------------------------------------------------------------------------ cda.theta_on
def ranked(fused, qff=None):
    articles = [
        SimpleNamespace(url=f"u{i}", title=f"Article {i}", section_titles=["Lead"], section_texts=[f"Fact {i} here."])
        for i in range(len(fused))
    ]
    qff = qff if qff is not None else [None] * len(fused)
    return [RankedArticle(a, s, qff=q) for a, s, q in zip(articles, fused, qff)]


# Twenty articles: S_1 - S_2 = 0.012 > theta, but the softmax of S / 0.07 spreads over all twenty, so that
# p_1 - p_2 = 0.0094 <= theta while p_1 - p_3 = 0.0102 > theta; the QFF scores of articles 2 and 3 are within 0.005.
CASE = ranked([0.500, 0.488] + [0.487] * 18, [0.300, 0.295, 0.2955] + [0.1] * 17)


@pytest.mark.slow
def test_each_theta_reading_passes_its_own_set_of_articles_on_a_constructed_case(splitter):
    kept = {}
    for theta_on in ("fused", "qff", "softmax"):
        cfg = CDAConfig(U=3, theta=0.01, theta_on=theta_on, chunk_tokens=50, K1=1, K2=1)
        context = select_context("which fact?", CASE, cfg, _Overlap(), words, splitter, temperature=0.07)
        kept[theta_on] = context.kept_articles
    assert kept == {"fused": [0], "softmax": [0, 1], "qff": [0, 1, 2]}
    wide = CDAConfig(U=3, theta=None, theta_on="qff")  # theta lifted: every reading keeps the top U
    assert select_context("?", CASE, wide, _Overlap(), words, splitter).kept_articles == [0, 1, 2]


class _Overlap:
    """A transparent chunk scorer: the number of the question's words in the chunk."""

    def score(self, pairs, batch_size=None, max_length=None, normalize=None):
        return [float(sum(w in passage.lower() for w in question.lower().split())) for question, passage in pairs]


fused_lists = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=20).map(
    lambda xs: sorted(xs, reverse=True)
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    fused=fused_lists,
    qff=st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=20, max_size=20),
    U=st.one_of(st.none(), st.integers(1, 5)),
    theta=st.floats(0.0, 0.5),
    wider=st.floats(0.0, 0.5),
    theta_on=st.sampled_from(["fused", "qff", "softmax"]),
    temperature=st.floats(0.01, 1.0),
)
def test_every_reading_keeps_article_one_stays_within_u_and_keeps_more_under_a_wider_theta(
    fused, qff, U, theta, wider, theta_on, temperature
):
    articles = ranked(fused, qff[: len(fused)])
    compared = theta_scores(articles, theta_on, temperature)
    kept = select_articles(fused, U, theta, compared)
    assert kept[0] == 0 and kept == sorted(set(kept)) and len(kept) <= (U or len(fused))
    assert set(kept) <= set(select_articles(fused, U, theta + wider, compared))
    assert select_articles(fused, U, None, compared) == list(range(min(U or len(fused), len(fused))))
    if theta_on == "softmax":  # a distribution over the ranked articles, in their order
        assert sum(compared) == pytest.approx(1.0) and all(a >= b - 1e-12 for a, b in zip(compared, compared[1:]))
    if theta_on == "fused":
        assert kept == select_articles(fused, U, theta)


@pytest.mark.slow
def test_theta_on_qff_needs_qff_scores_and_softmax_a_temperature(world, splitter):
    from qkvqa.pipeline.build import check_theta_on

    with pytest.raises(ConfigError, match="cda.theta_on=qff compares the articles' QFF scores"):
        select_context("?", ranked([0.5, 0.4]), CDAConfig(theta_on="qff"), _Overlap(), words, splitter)
    with pytest.raises(ConfigError, match="cda.theta_on=softmax needs a positive qff.temperature"):
        ContextSelector(CDAConfig(theta_on="softmax"), splitter, words, _Overlap())
    with pytest.raises(ConfigError, match="eval.filter=retrieval does not compute"):  # before stage 1 runs
        check_theta_on(world_cfg(world, "eval.filter=retrieval", "cda.theta_on=qff"))
    check_theta_on(world_cfg(world, "eval.filter=retrieval", "cda.theta_on=softmax"))
    check_theta_on(world_cfg(world, "cda.theta_on=qff"))


@pytest.mark.slow
def test_the_softmax_reading_uses_the_configured_temperature(world):
    """An evaluation's CDA gets qff.temperature (the paper's tau) for the softmax reading."""
    from qkvqa.pipeline.build import build_pipeline

    cfg = world_cfg(world, "cda.theta_on=softmax", "qff.temperature=0.5", "eval.filter=retrieval")
    from qkvqa.data.benchmark import build_benchmark

    pipeline = build_pipeline(cfg, build_benchmark(cfg.data), 0.0)
    assert pipeline.selector.temperature == 0.5 and pipeline.selector.cfg.theta_on == "softmax"


# ------------------------------------------------------------------------------------ cda.chunk_length_counts
sentence = st.integers(1, 9).map(lambda n: " ".join(["word"] * n) + ".")
sections = st.lists(st.lists(sentence, min_size=1, max_size=8).map(" ".join), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(texts=sections, title_words=st.integers(1, 6), section_words=st.integers(1, 4), L=st.integers(8, 40))
def test_with_header_chunks_a_section_as_body_chunks_of_l_minus_its_header(
    splitter, texts, title_words, section_words, L
):
    title, section_title = " ".join(["Title"] * title_words), " ".join(["Part"] * section_words)
    article = SimpleNamespace(
        url="u", title=title, section_titles=[section_title] * len(texts), section_texts=list(texts)
    )
    header = words(section_string(title, section_title, ""))
    body = Chunker(splitter, words, L).chunk_article(article)
    with_header = Chunker(splitter, words, L, counts="with_header").chunk_article(article)
    assert Chunker(splitter, words, L, counts="with_header").header_tokens(title, section_title) == header
    shorter = Chunker(splitter, words, max(1, L - header)).chunk_article(article)
    assert [(c.text, c.token_count) for c in with_header] == [(c.text, c.token_count) for c in shorter]
    assert len(with_header) >= len(body)
    for chunk in with_header:  # header and body within L, unless one sentence alone is longer
        if len(splitter.split_many([chunk.text])[0]) > 1:
            assert words(chunk.render()) <= L and chunk.token_count <= L - header


def test_with_header_keeps_rendered_chunks_within_l_in_the_generator_s_own_tokens(world, splitter):
    """On the world's KB with the tiny generators' byte-level tokenizer, every rendered chunk of several sentences
    is within L under with_header; under body the header comes on top, so first chunks run past L."""
    from transformers import AutoTokenizer

    from qkvqa.components.registry import ComponentSpec, tiny_model
    from qkvqa.data.kb import KBStore
    from qkvqa.generation.backends import Llama3Format
    from qkvqa.generation.tiny import write_tiny_llama3

    path = tiny_model(ComponentSpec(kind="llama3"), write_tiny_llama3)
    count = Llama3Format(AutoTokenizer.from_pretrained(str(path), local_files_only=True)).count_tokens
    L = 200  # bytes: a few of the world's sentences
    store = KBStore.open(Path(world["dir"]) / "kb/store")
    over_in_body, multi = 0, 0
    for article in list(store)[:12]:
        for chunk in Chunker(splitter, count, L, counts="with_header").chunk_article(article):
            if len(splitter.split_many([chunk.text])[0]) > 1:
                multi += 1
                assert count(chunk.render()) <= L
        over_in_body += sum(count(c.render()) > L for c in Chunker(splitter, count, L).chunk_article(article))
    assert multi > 0 and over_in_body > 0


# --------------------------------------------------------------------------------------------- the card
@pytest.mark.slow
@pytest.mark.parametrize(
    "row, expected",
    [
        ("eval/evqa_qwen", ["qff.question_norm", "candidate sections", "cda.theta_on", "cda.chunk_length_counts"]),
        (
            "eval/infoseek_llama31_ft",
            ["qff.question_norm", "candidate sections", "cda.theta_on", "cda.chunk_length_counts", "decoding"],
        ),
        ("table5/evqa_first_chunk", ["qff.question_norm", "candidate sections", "cda.chunk_length_counts"]),
        ("figure5/alpha", ["qff.question_norm", "candidate sections"]),
        ("table2/evqa_mllm_filter", []),
    ],
)
def test_the_card_names_the_readings_a_row_depends_on_and_another_reading_is_no_reason(row, expected, tmp_path):
    from qkvqa.config.paper_rows import PAPER_ROWS
    from qkvqa.pipeline.protocol import protocol_card, render_card, used_components
    from tests.unit.test_paper_rows import row_config, scores_of, verdict

    class KB:
        store_dir, url_checksum = tmp_path / "kb", "sha256:0"

        def __len__(self):
            return 3

    paper = PAPER_ROWS[row]
    cfg = row_config(paper)
    card = protocol_card(cfg, scores_of(paper), KB())
    assert list(card["readings"]) == expected
    assert all(r["value"] == r["paper_text"] for r in card["readings"].values())  # the defaults: the paper's text
    switches = {
        "qff.question_norm": "across_tokens",
        "cda.theta_on": "softmax",
        "cda.chunk_length_counts": "with_header",
    }
    for key, other in switches.items():
        if key not in expected:
            continue
        changed = row_config(paper)
        OmegaConf.update(changed, key, other)
        assert verdict(changed, scores_of(paper)) == verdict(cfg, scores_of(paper))  # not a reason
        text = render_card(protocol_card(changed, scores_of(paper), KB()))
        assert f"{key} {other} (the paper's text: " in text
        assert "may have been made the other way" in text
    assert used_components(cfg)  # the row's own components (the card's other rows are tested in test_paper_rows)


def test_compare_counts_qff_temperature_as_an_evaluation_setting_under_the_softmax_reading():
    from qkvqa.compare.rows import RunRow
    from qkvqa.compare.table import applies

    def row(**config):
        return RunRow("r", "finished", "e", config, {}, None, "src", task="evaluate")

    assert not applies(row(**{"eval.filter": "qff", "cda.theta_on": "fused"}), "qff.temperature")
    assert applies(row(**{"eval.filter": "qff", "cda.theta_on": "softmax"}), "qff.temperature")
    assert applies(row(**{"eval.filter": "retrieval", "cda.theta_on": "softmax"}), "qff.temperature")


@pytest.mark.slow
def test_the_alpha_sweep_under_both_norms_is_figure_5_twice_and_every_trial_is_comparable():
    from qkvqa.config.paper_rows import PAPER_ROWS
    from qkvqa.sweep.spec import load_sweep
    from tests.unit.test_paper_rows import EXPERIMENTS, scores_of, verdict

    spec = load_sweep(EXPERIMENTS / "sweeps" / "alpha_sweep_norms.yaml")
    trials = spec.trial_params(None, 0)
    assert {(t["qff.alpha"], t["qff.question_norm"]) for t in trials} == {
        (round(0.1 * i, 1), norm) for i in range(11) for norm in ("per_token", "across_tokens")
    }
    row = PAPER_ROWS["figure5/alpha"]
    for params in trials[::5]:
        cfg = compose(
            "eval/evqa_qwen", [], [f"{k}={v}" for k, v in params.items()] + ["qff.checkpoint=checkpoints/evqa_qff/qff"]
        )
        assert cfg.qff.question_norm == params["qff.question_norm"] and verdict(cfg, scores_of(row)) == []


def test_an_evaluation_reports_how_often_a_second_article_passes_theta():
    """What cda.theta_on moves, in every evaluation's scores (`second_article_kept`, `eval/second_article_kept`):
    over the full-CDA contexts only."""
    from qkvqa.pipeline.scoring import second_article_kept

    rows = [
        {"context": {"mode": "full", "kept_articles": [0, 1]}},
        {"context": {"mode": "full", "kept_articles": [0]}},
        {"context": {"mode": "first_chunk", "kept_articles": [0]}},
        {"prediction": "", "skipped": "query image missing"},
    ]
    assert second_article_kept(rows) == 50.0
    assert second_article_kept(rows[2:]) is None
