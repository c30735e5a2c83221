"""How far each reading of the paper moves a row (issue 47): qff.question_norm, cda.theta_on and
cda.chunk_length_counts on the synthetic world, and Figure 5's alpha grid under both question norms.

    python bench/paper_readings.py                  # 60 entities, a tiny QFF trained 3 epochs: 9 min on 2 busy cores
    python bench/paper_readings.py --entities 36 --epochs 1 --name paper_readings_quick      # a quick look

What runs, and what is a stand-in (the real models are not on this machine):

- the world: `qkvqa synth` (seed 0); its E-VQA val + test questions and its InfoSeek questions, one shared KB;
- the QFF: a tiny per_layer QFF (64 hidden channels, 8 query tokens) trained by `qkvqa train
  experiment=demo/qff_per_layer` on the learning test's pools (tests/helpers/qff_study.py), reused from --work. Its
  across-token scores are about sqrt(64 / 8) = 2.8 times a cosine, where BLIP-2's are sqrt(768 / 32) = 4.9 times;
- stage 1: a seeded stand-in with the spread of a dense retriever (the gold article first for 45 % of the questions,
  in the top 5 for about 70 %, in the top 20 for 85 %; cosine-like similarities from about 0.25 down, gaps of
  `--gap` 0.004 on average), so that alpha decides how far the QFF may move an article. These are assumptions;
- the filter: `QFFReranker` (the code `qkvqa rerank` and `qkvqa evaluate` run) with the switch; each alpha of the
  grid re-fuses the same section scores with `qkvqa.qff.scoring.rerank`;
- CDA: `ContextSelector` (U 2, theta 0.01, K1 4, K2 2, L 60 on E-VQA and 90 on InfoSeek) with spaCy sentences; the
  chunk reranker is a word-overlap stand-in (the tiny BGE is random), and token counts are the pieces of Qwen2's
  pre-tokenizer (a BPE token per piece for the world's words; Qwen2.5's tokenizer is not here);
- answer-in-context: `qkvqa.pipeline.scoring.answer_in_context`, as every evaluation reports it.

The world's sections are short (about 43 pieces, where Wikipedia's run to hundreds of tokens), so L rarely splits
one; the context-length table therefore also runs at half L (30 / 45), where the chunks are cut as on real sections.
Writes bench/out/<name>.json and bench/out/<name>.md.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "bench" / "out"

# Table 5's context lengths (tokens): first chunk only, K1 chunks of the top-1 article, full CDA.
TABLE5 = {
    "evqa": {"first_chunk": 55, "top1_article_chunks": 213, "full": 246},
    "infoseek": {"first_chunk": 86, "top1_article_chunks": 294, "full": 334},
}
L_PAPER = {"evqa": 60, "infoseek": 90}
ALPHAS = [round(0.1 * i, 1) for i in range(11)]  # Figure 5's grid
NORMS = ("per_token", "across_tokens")
THETA_ON = ("fused", "qff", "softmax")
COUNTS = ("body", "with_header")
MODES = ("first_chunk", "top1_article_chunks", "full")
TOP_K = 20
# Qwen2's pre-tokenizer (tokenizer.json of Qwen2.5): each piece is one BPE token when the vocabulary has it whole
PIECES = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def count_pieces():
    import regex

    pattern = regex.compile(PIECES)
    return lambda text: len(pattern.findall(text))


class Overlap:
    """Chunk reranker stand-in: the share of the question's words found in the chunk body (below its header)."""

    def score(self, pairs, batch_size=None, max_length=None, normalize=None):
        out = []
        for question, passage in pairs:
            q = [w.strip("?.,") for w in question.lower().split()]
            body = {w.strip(".,") for w in passage.split("\n", 2)[-1].lower().split()}
            out.append(sum(w in body for w in q) / max(len(q), 1))
        return out


def stand_in_stage1(records: list, entities: list, seed: int, gap: float) -> dict:
    """ "split/data_id" -> Retrieved (E-VQA ids repeat per file): the gold article at a seeded rank (0 for 45 %, 1-4 for 25 %, 5-19 for 15 %, else out of
    the top 20), the other entities the image shows next, then others; similarities with a dense retriever's spread."""
    from qkvqa.retrieval.results import Retrieved

    by_id = {e["entity_id"]: e for e in entities}
    by_url = {e["url"]: e for e in entities}
    out = {}
    for key, record in records:
        rng = random.Random(f"{seed}/{key}")
        gold = [by_url[u] for u in record["gold_urls"] if u in by_url][:1]
        shown = [by_id[e] for e in record.get("image_entities", []) if by_id[e] not in gold]
        rest = [e for e in entities if e not in gold and e not in shown]
        rng.shuffle(rest)
        others = (shown + rest)[:TOP_K]
        u = rng.random()
        rank = 0 if u < 0.45 else rng.randint(1, 4) if u < 0.70 else rng.randint(5, TOP_K - 1) if u < 0.85 else None
        ranked = others[:TOP_K] if rank is None or not gold else (others[:rank] + gold + others[rank:])[:TOP_K]
        sim, sims = 0.25 + rng.uniform(-0.02, 0.02), []
        for _ in ranked:
            sims.append(sim)
            sim -= rng.expovariate(1 / gap)
        out[key] = Retrieved([e["url"] for e in ranked], [e["title"] for e in ranked], sims)
    return out


def train_qff(work: Path, entities: int, epochs: int, threads: int) -> tuple[list[str], Path]:
    """World, pools and ViT cache (qff_study.prepare) and one tiny per_layer QFF, reused when already trained."""
    from tests.helpers.qff_study import prepare, run_id, train

    overrides, _ = prepare(work, entities)
    model = work / "runs" / run_id("per_layer", 0) / "qff"
    if not (model / "model.safetensors").exists():
        codes = train(work, overrides, [("per_layer", 0)], epochs=epochs, parallel=1, threads=threads)
        if codes[("per_layer", 0)] != 0:
            raise SystemExit(f"training failed; see {work}/log_per_layer_0.txt")
    return overrides, model


def score_sections(cfg, benchmark, stage1: dict, questions: dict) -> dict:
    """key -> (stage-1 urls, sims, section scores per article, section indices) with the config's QFF, through
    `QFFReranker` (the code of `qkvqa rerank` and of an evaluation's QFF filter)."""
    from qkvqa.qff.rerank import QFFReranker

    reranker = QFFReranker.from_config(cfg, benchmark)
    out, items, ids = {}, [], []
    for key, q in questions.items():
        image = benchmark.image_loader.load(q.dataset_name, q.image_id)
        if image is None:
            continue
        items.append((q.question, image, stage1[key]))
        ids.append(key)
    for data_id, result in zip(ids, reranker.rerank_many(items)):
        # back to stage-1 order, so that any alpha can fuse again
        order = {u: k for k, u in enumerate(result.urls)}
        urls = [u for u in stage1[data_id].urls[:TOP_K] if u in order]
        out[data_id] = (
            urls,
            [result.stage1_similarities[order[u]] for u in urls],
            [result.section_scores[order[u]] for u in urls],
            [result.section_indices[order[u]] for u in urls],
        )
    return out


def ranked_articles(store, entry, alpha: float):
    """RankedArticles in fused order at `alpha` (what the QFF filter hands CDA)."""
    from qkvqa.cda.select import RankedArticle
    from qkvqa.qff.scoring import rerank

    urls, sims, scores, indices = entry
    result = rerank(sims, scores, alpha)
    out = []
    for k, i in enumerate(result.order):
        out.append(
            RankedArticle(
                store.get_by_url(urls[i]),
                result.fused_scores[k],
                dict(zip(indices[i], scores[i])),
                sim_ret=sims[i],
                qff=result.qff_scores[k],
            )
        )
    return out


def recall(entries: dict, questions: dict, alpha: float) -> dict:
    """Single-hop article R@1 / R@5 after the filter at `alpha` (percent; a question without a query image misses)."""
    from qkvqa.data.questions import TWO_HOP_TYPE
    from qkvqa.qff.scoring import rerank

    hits = {1: 0, 5: 0}
    single = [(key, q) for key, q in questions.items() if q.question_type != TWO_HOP_TYPE and q.gold_urls]
    for key, q in single:
        entry = entries.get(key)
        if entry is None:
            continue
        urls, sims, scores, _ = entry
        order = [urls[i] for i in rerank(sims, scores, alpha).order]
        for k in hits:
            hits[k] += any(u in q.gold_urls for u in order[:k])
    return {f"R@{k}": 100 * v / max(len(single), 1) for k, v in hits.items()} | {"n": len(single)}


def cda(store, entries, questions, splitter, count, mode, L, theta_on="fused", counts="body", alpha=0.9) -> dict:
    """Mean context tokens, % of questions with a second article kept, answer-in-context (%), over the questions."""
    from qkvqa.cda.select import ContextSelector
    from qkvqa.config.schema import CDAConfig
    from qkvqa.pipeline.scoring import answer_in_context

    cfg = CDAConfig(mode=mode, U=2, theta=0.01, theta_on=theta_on, chunk_tokens=L, chunk_length_counts=counts)
    selector = ContextSelector(cfg, splitter, count, Overlap(), temperature=0.07)
    ids = [i for i in questions if i in entries]
    contexts = selector.select_many([(questions[i].question, ranked_articles(store, entries[i], alpha)) for i in ids])
    inside = [answer_in_context(questions[i], c.text) for i, c in zip(ids, contexts)]
    inside = [v for v in inside if v is not None]
    return {
        "context_tokens": sum(c.token_count for c in contexts) / len(contexts),
        "second_article_pct": 100 * sum(len(c.kept_articles) > 1 for c in contexts) / len(contexts),
        "answer_in_context_pct": 100 * sum(inside) / max(len(inside), 1),
        "n": len(contexts),
    }


def note(text: str, start: float) -> None:
    print(f"[{time.perf_counter() - start:6.0f} s] {text}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=3, help="QFF training epochs")
    parser.add_argument("--seed", type=int, default=0, help="stage-1 stand-in seed")
    parser.add_argument("--gap", type=float, default=0.004, help="stage-1 stand-in: mean gap between neighbours")
    parser.add_argument("--work", default="/tmp/qkvqa_paper_readings", help="scratch directory (world, QFF), reused")
    parser.add_argument("--name", default="paper_readings")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (training and scoring)")
    args = parser.parse_args(argv)
    import os

    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("QKVQA_PROGRESS", "0")
    import torch
    import yaml

    from qkvqa.components import build_component
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.data.config import data_config_from_dict
    from tests.helpers.qff_study import compose_run

    start = time.perf_counter()
    work = Path(args.work) / f"e{args.entities}"
    overrides, model = train_qff(work, args.entities, args.epochs, args.threads)
    trained_s = time.perf_counter() - start
    note("world, pools and QFF ready", start)
    torch.set_num_threads(args.threads)
    world = json.loads((work / "world" / "world.json").read_text())
    splitter = build_component({"kind": "spacy_sentencizer", "tiny": True})
    count = count_pieces()
    data = {
        "evqa": None,  # the training config's own (E-VQA)
        "infoseek": data_config_from_dict(yaml.safe_load((work / "world" / "data_infoseek.yaml").read_text())),
    }
    # the splits' question files (world.json's keys): E-VQA val + test, InfoSeek's val questions (split test here)
    files = {
        "evqa": {"val": "evqa/val.csv", "test": "evqa/test.csv"},
        "infoseek": {"test": "infoseek/infoseek_test_filtered.csv"},
    }
    result = {
        "benchmark": args.name,
        "entities": args.entities,
        "epochs": args.epochs,
        "stage1_seed": args.seed,
        "stage1_gap": args.gap,
        "threads": args.threads,
    }
    scored, questions, stores = {}, {}, {}
    for dataset in ("evqa", "infoseek"):
        records = [(f"{split}/{r['data_id']}", r) for split, f in files[dataset].items() for r in world["questions"][f]]
        stage1 = stand_in_stage1(records, world["entities"], args.seed, args.gap)
        for norm in NORMS:
            cfg = compose_run(
                "demo/qff_per_layer",
                [*overrides, f"qff.checkpoint={model}", f"qff.question_norm={norm}", "qff.vit_cache=null"],
            )
            if data[dataset] is not None:
                cfg.data = data[dataset]
            benchmark = build_benchmark(cfg.data)
            qs = {f"{split}/{q.data_id}": q for split in files[dataset] for q in benchmark.questions(split)}
            questions[dataset], stores[dataset] = qs, benchmark.kb_store()
            scored[dataset, norm] = score_sections(cfg, benchmark, stage1, qs)
            note(f"{dataset} {norm}: {len(scored[dataset, norm])} questions scored", start)
        flat = [s for e in scored[dataset, "per_token"].values() for a in e[2] for s in a]
        flat_across = [s for e in scored[dataset, "across_tokens"].values() for a in e[2] for s in a]
        result.setdefault("qff_score_mean", {})[dataset] = {
            "per_token": sum(flat) / len(flat),
            "across_tokens": sum(flat_across) / len(flat_across),
        }
    # 1. question_norm (and theta_on under each: item 1 feeds item 2)
    rows = []
    for dataset in ("evqa", "infoseek"):
        for norm in NORMS:
            entries = scored[dataset, norm]
            r = recall(entries, questions[dataset], 0.9)
            for theta_on in THETA_ON:
                c = cda(
                    stores[dataset],
                    entries,
                    questions[dataset],
                    splitter,
                    count,
                    "full",
                    L_PAPER[dataset],
                    theta_on=theta_on,
                )
                rows.append({"dataset": dataset, "question_norm": norm, "theta_on": theta_on, **r, **c})
    result["norm_and_theta"] = rows
    note("question_norm x theta_on done", start)
    # 2. chunk_length_counts per CDA mode, at the paper's L and half of it
    lengths = []
    for dataset in ("evqa", "infoseek"):
        entries = scored[dataset, "per_token"]
        for L in (L_PAPER[dataset], L_PAPER[dataset] // 2):
            for mode in MODES:
                for counts in COUNTS:
                    c = cda(stores[dataset], entries, questions[dataset], splitter, count, mode, L, counts=counts)
                    lengths.append(
                        {
                            "dataset": dataset,
                            "L": L,
                            "mode": mode,
                            "counts": counts,
                            "table5_tokens": TABLE5[dataset][mode] if L == L_PAPER[dataset] else None,
                            **c,
                        }
                    )
    result["chunk_length_counts"] = lengths
    note("chunk_length_counts done", start)
    # 3. Figure 5's alpha grid under both norms (E-VQA single-hop, as the figure)
    result["alpha_sweep"] = {
        norm: {str(a): recall(scored["evqa", norm], questions["evqa"], a) for a in ALPHAS} for norm in NORMS
    }
    result["seconds"] = {"prepare_and_train": trained_s, "total": time.perf_counter() - start}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    text = render(result, " ".join(["python bench/paper_readings.py", *(argv or sys.argv[1:])]))
    (OUT / f"{args.name}.md").write_text(text)
    print(text)
    return 0


def render(result: dict, command: str) -> str:
    def f(x, digits=1):
        return "-" if x is None else f"{x:.{digits}f}"

    mean = result["qff_score_mean"]
    lines = [
        f"# How far each reading moves a row (issue 47): synthetic world, {result['entities']} entities",
        "",
        f"`{command}`; a tiny QFF (64 hidden channels, 8 queries) trained {result['epochs']} epochs, stage 1 a seeded "
        "stand-in, word-overlap chunk reranker, Qwen2 pre-tokenizer pieces as tokens (bench/paper_readings.py's "
        "docstring). Figures of one world and one trained model: a direction and a size, not the paper's numbers.",
        "",
        "Mean section score, across_tokens / per_token: "
        + ", ".join(
            f"{d} {mean[d]['across_tokens']:.3f} / {mean[d]['per_token']:.3f} "
            f"(x{mean[d]['across_tokens'] / mean[d]['per_token']:.2f})"
            for d in mean
        )
        + " (BLIP-2's 768 channels over 32 queries: about x4.9).",
        "",
        "## qff.question_norm x cda.theta_on (full CDA, alpha 0.9, U 2, theta 0.01, paper L)",
        "",
        "| dataset | question_norm | theta_on | R@1 | R@5 | 2nd article kept % | context tokens | answer in context % | n |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["norm_and_theta"]:
        lines.append(
            f"| {r['dataset']} | {r['question_norm']} | {r['theta_on']} | {f(r['R@1'])} | {f(r['R@5'])} | "
            f"{f(r['second_article_pct'])} | {f(r['context_tokens'])} | {f(r['answer_in_context_pct'])} | {r['n']} |"
        )
    lines += [
        "",
        "## cda.chunk_length_counts: context tokens per CDA mode (per_token, fused theta)",
        "",
        "| dataset | L | mode | Table 5 | body | with_header | with_header / body | answer in context % body / with_header |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = {(r["dataset"], r["L"], r["mode"], r["counts"]): r for r in result["chunk_length_counts"]}
    for (dataset, L, mode, counts), r in rows.items():
        if counts != "body":
            continue
        h = rows[dataset, L, mode, "with_header"]
        lines.append(
            f"| {dataset} | {L} | {mode} | {r['table5_tokens'] or '-'} | {f(r['context_tokens'])} | "
            f"{f(h['context_tokens'])} | {h['context_tokens'] / r['context_tokens']:.2f} | "
            f"{f(r['answer_in_context_pct'])} / {f(h['answer_in_context_pct'])} |"
        )
    lines += [
        "",
        "## Figure 5's alpha grid: E-VQA single-hop article R@1 (R@5) after the filter",
        "",
        "| alpha | " + " | ".join(NORMS) + " |",
        "|---|---|---|",
    ]
    sweep = result["alpha_sweep"]
    for a in ALPHAS:
        cells = [f"{f(sweep[n][str(a)]['R@1'])} ({f(sweep[n][str(a)]['R@5'])})" for n in NORMS]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"{result['seconds']['total']:.0f} s in all ({result['seconds']['prepare_and_train']:.0f} s "
        "world, pools and training, reused on a rerun with the same --work).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
