"""`qkvqa rerank`: apply a trained QFF to a split's stage-1 results; OMGM step-2b output with per-section scores, Recall@K."""

from __future__ import annotations

import argparse
import json
import numbers

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add the `rerank` command."""
    parser = subparsers.add_parser(
        "rerank",
        help="rerank stage-1 results with a trained QFF (alpha fusion) and report Recall@K",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="As a run: for every question of split=X (retrieval.split), score all candidate sections of\n"
        "its stage-1 top-K articles (retrieval.top_k) with the QFF of qff.checkpoint (a `qkvqa train`\n"
        "RUN/qff directory or a RUN/*.ckpt; unset: components.qformer as it is), each article image\n"
        "through the ViT once, sections in batches of qff.section_batch_size; fuse\n"
        "S = qff.alpha * sim_ret + (1 - qff.alpha) * max section score, and write\n"
        "RUN/reranked_{split}.json in the OMGM step-2b layout: {data_id: {retrieved_entities,\n"
        "retrieval_similarities (fused), sec_sim, sec_idx (original section indices), qff_scores,\n"
        "stage1_similarities}}, and beside it reranked_{split}.meta.json: what produced it (qff.alpha,\n"
        "retrieval.top_k, the QFF and its weights, the KB, stage 1), which `qkvqa evaluate\n"
        "eval.filter=precomputed` checks and reports. Recall@K before and after the QFF and the top-1\n"
        "evidence-section recall go into summary.json. Stage-1 results: retrieval.results=FILE, else\n"
        "retrieved now.\n\n"
        "  qkvqa rerank experiment=evqa_qff split=test qff.checkpoint=checkpoints/RUN/qff \\\n"
        "      retrieval.results=checkpoints/RETRIEVE_RUN/retrieval_test.json",
    )
    add_override_args(parser)
    parser.set_defaults(func=_run, opens_run=True)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.cli.embed import expand_shorthands
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.pipeline.protocol import component_card
    from qkvqa.qff.rerank import rerank_split, write_reranked
    from qkvqa.run.job import run_job

    args.overrides = expand_shorthands(args.overrides)
    cfg = config_from_args(args)
    with run_job(cfg, "rerank") as job:
        benchmark = build_benchmark(cfg.data)
        result = rerank_split(cfg, benchmark=benchmark)
        benchmark.image_loader.write_skipped(job.run.run_dir)
        qformer = component_card(cfg.components.qformer, cfg.qff.checkpoint)  # weights and their fingerprint
        path = write_reranked(
            job.run.run_dir / f"reranked_{result.split}.json",
            result.results,
            {**result.produced_by, "qformer": qformer, "run_id": job.run.run_id},
        )
        numeric = {k: v for k, v in result.metrics.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}
        stage1 = {k: v for k, v in result.stage1_metrics.items() if k.startswith("recall@")}
        job.record.update_summary(
            {
                **{f"rerank/{result.split}/{k}": v for k, v in result.metrics.items()},
                **{f"rerank/{result.split}/stage1/{k}": v for k, v in stage1.items()},
                f"rerank/{result.split}/results": str(path),
            }
        )
        job.record.append_metrics({f"rerank/{result.split}/{k}": v for k, v in numeric.items()}, step=0)
    print(
        json.dumps(
            {
                "run_dir": str(job.run.run_dir),
                "results": str(path),
                **numeric,
                **{f"stage1/{k}": v for k, v in stage1.items()},
            }
        )
    )
    return 0
