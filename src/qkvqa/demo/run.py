"""Run the demo's stages in order, reusing every stage a previous `make demo` finished."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from qkvqa.demo.report import (
    COLUMNS,
    comparison_rows,
    goal_lines,
    markdown_table,
    miss_reasons,
    plot_recall,
    plot_training,
)
from qkvqa.run.rundir import clear_run_env
from qkvqa.utils.io import atomic_write_text
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

STEPS = 6
TRAINING = {"per_layer": "demo/qff_per_layer", "none": "demo/qff_none"}
# The settings `qkvqa inspect` compares question by question in the demo's site (A, then B): stage 1's order against
# the full method (the trained QFF with question focus, then CDA).
INSPECT = ("stage 1 only", "+ CDA (full method)")
# The rows of the report, stage by stage (label -> (QFF training run or None, overrides of demo/evaluate)). Without
# CDA the generator reads the top-1 article's best chunks (cda.mode=top1_article_chunks, the paper's Table 5 row).
SETTINGS = {
    "stage 1 only": (None, ["eval.filter=retrieval", "cda.mode=top1_article_chunks"]),
    "+ QFF without focus": ("none", ["qff.focus=none", "cda.mode=top1_article_chunks"]),
    "+ QFF with focus": ("per_layer", ["cda.mode=top1_article_chunks"]),
    "+ CDA (full method)": ("per_layer", []),
    "top-1 section, no CDA (ablation)": ("per_layer", ["cda.mode=top1_section"]),
}
# The wheels' real models in the stages that have one (experiments/presets/wheel_models.yaml): SmolLM2-135M-Instruct
# answers with the paper's prompt and all-MiniLM-L6-v2 ranks CDA's chunks (demo/evaluate answers with the extractive
# reader unless told otherwise: an experiment's own keys come after its presets).
REAL_MODELS = ["preset=wheel_models", "generation.reader=generator"]
# With the real generator, one more row: the extractive reader on the full method's context, as a reference.
REFERENCE = (
    "extractive reader on the full method's context (reference)",
    ("per_layer", ["generation.reader=extractive"]),
)
WHAT_IS_REAL = """\
**What is real here, and what was trained here.** Real, pretrained elsewhere and shipped in pinned wheels
(experiments/presets/wheel_models.yaml): the generator, SmolLM2-135M-Instruct answering with the paper's appendix prompt,
and CDA's chunk scorer, the all-MiniLM-L6-v2 sentence encoder (a bi-encoder in place of the paper's BGE cross-encoder).
Trained here, on the world's train split only: the stage-1 image encoder (a tiny EVA-CLIP stand-in, random at first,
trained contrastively by `qkvqa pretrain-retriever`: question images and KB images against KB images of the same
article) and the QFF (a tiny BLIP-2 Q-Former, random text layers: the MiniLM-initialised Q-Former of preset
qformer_minilm does not train in the demo's time on two cores). The extractive reader's row (the span after the
linking word of the context sentence nearest the question, no language model) is a reference for the generator."""

TINY_MODELS = """\
**What this run is.** It was run with tiny random models only (`--tiny-models`): the generator is replaced by the
extractive reader (the span after the linking word of the context sentence nearest the question, no language model)
and CDA's chunk scorer is random, so answer accuracy says whether the filter and CDA put the answer sentence first,
nothing about a language model. The stage-1 image encoder and the QFF were trained here on the train split."""

HONEST = """\
**Question focus, and what this one run can say about it.** The two QFF rows below are one training
seed each, and a seed alone moves section R@1 by 4-8 points (sd over 8 seeds). The paired study over 8
seeds (bench/qff_focus.py, docs/training.md "The focus study") measured the demo's setting (per_layer,
tanh gate, the base lr for the new blocks) against none on the controlled world built to need focus:
section R@1 60.7 +- 5.3 (mean +- sd) against 61.6 +- 5.1, a paired difference of -0.9 points (95 %
interval -3.1 to +1.3); on this demo's kind of world -0.6 (-5.7 to +4.5), with per-seed differences
from -7.7 to +10.6. So a gap of that size between the two rows here is seed noise: at this scale,
question focus neither helps nor hurts measurably. The study
also says why: these tiny models memorise their training sections and do not learn which words a
question asks for, with or without focus. The study can see an effect that exists: its positive control,
a focus path handed whether each section states the asked attribute, beats none by +35.6 points section
R@1 (95 % interval +31.0 to +40.2, 8 seeds; bench/out/qff_focus_random_init.json), and text layers
pretrained here (components.qformer.init: pretrained_here) leave focus at +2.1 (-1.5 to +5.8): no setting shows the
effect at this scale, so the demo keeps per_layer (docs/training.md has the diagnosis)."""


class OncePerRun(logging.Filter):
    """Lets each distinct WARNING through once: the world's deliberately missing images were warned by each of the
    demo's evaluations (and each DataLoader of one), the same lines four times over."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def _finished(runs: Path, run_id: str) -> bool:
    status = runs / run_id / "status.json"
    return status.exists() and json.loads(status.read_text(encoding="utf-8")).get("state") == "finished"


class Demo:
    """The demo's directories and stages; each stage is a qkvqa command run in-process by `run_command` (the command
    line's own `qkvqa.cli.main.main`, which `qkvqa demo` passes in: the demo sits below the command line)."""

    def __init__(
        self,
        out: Path,
        runs: Path,
        entities: int,
        seed: int,
        epochs: Optional[int] = None,
        *,
        retriever_steps: Optional[int] = None,
        real_models: bool = True,
        questions: int = 0,
        run_command: Optional[Callable[[list[str]], int]] = None,
    ):
        self.out, self.runs, self.entities, self.seed, self.epochs = out, runs, entities, seed, epochs
        self.retriever_steps = retriever_steps
        self.real_models = real_models
        self.models = list(REAL_MODELS) if real_models else []
        # with the real generator, a seeded sample of the test split (the same questions in every row) fits the time
        self.questions = questions if real_models and questions else None
        if self.questions:
            self.models.append(f"data.sample_questions={self.questions}")
        self.run_command = run_command
        self.world = out / "world"
        self.common = [
            f"paths.world_dir={self.world}",
            f"paths.cache_dir={out / 'cache'}",
            f"paths.checkpoints_root={runs}",
            f"seed={seed}",
            # the multi-entity photos are padded to a square, not cut to their middle entity (EchoSight's targetpad)
            "components.image_encoder.options.preprocess=targetpad",
        ]
        self.retriever: dict = {}
        self.timings: dict[str, float] = {}

    def step(self, number: int, title: str, fn) -> None:
        log.info("[demo %d/%d] %s", number, STEPS, title)
        start = time.perf_counter()
        fn()
        self.timings[title] = time.perf_counter() - start

    def make_world(self) -> None:
        manifest = self.world / "world.json"
        if manifest.exists():
            world = json.loads(manifest.read_text(encoding="utf-8"))
            if world.get("seed") == self.seed and world["counts"]["entities"] == self.entities:
                log.info("reusing the synthetic world in %s", self.world)
                return
        from qkvqa.synth.world import generate_world

        generate_world(self.world, entities=self.entities, seed=self.seed)

    def _cli(self, args: Sequence[str]) -> None:
        """Run `qkvqa ARGS` in-process (a fresh run environment each time); SystemExit when it fails."""
        if self.run_command is None:
            raise RuntimeError("Demo(run_command=...) is not set: `qkvqa demo` passes qkvqa.cli.main.main")
        clear_run_env()
        rc = self.run_command(list(args))
        if rc != 0:
            raise SystemExit(f"demo step failed: qkvqa {' '.join(args)} (exit {rc})")

    def pretrain_retriever(self) -> None:
        """Train the stage-1 image encoder on the train split (`qkvqa pretrain-retriever`, cached by its inputs: a
        second run finds it) and make every later stage load it."""
        steps = [f"retrieval.pretrain.steps={self.retriever_steps}"] if self.retriever_steps else []
        self._cli(["pretrain-retriever", "experiment=demo/evaluate", *self.common, *steps])
        from qkvqa.config.load import compose
        from qkvqa.data.benchmark import build_benchmark
        from qkvqa.retrieval.pretrain import build, encoder_overrides

        cfg = compose("demo/evaluate", [], [*self.common, *steps])
        out, record = build(cfg, build_benchmark(cfg.data))  # found: the command just built it
        self.retriever = {"dir": str(out), **record["figures"]}
        self.common += encoder_overrides(out)

    def stage1(self) -> None:
        self._cli(["embed", "experiment=demo/evaluate", "run_id=demo-embed", "resume=auto", *self.common])  # resumable
        from qkvqa.config.load import compose
        from qkvqa.data.benchmark import build_benchmark
        from qkvqa.errors import StaleArtifactError
        from qkvqa.retrieval.retrieve import load_index_from_config

        try:
            cfg = compose("demo/evaluate", [], self.common)
            load_index_from_config(cfg, build_benchmark(cfg.data))
            log.info("reusing the stage-1 index")
        except StaleArtifactError:
            self._cli(["index", "build", "experiment=demo/evaluate", "run_id=demo-index", "resume=auto", *self.common])

    def train(self) -> None:
        for focus, experiment in TRAINING.items():
            run_id = f"demo-qff-{focus}"
            if _finished(self.runs, run_id):
                log.info("reusing trained QFF %s", run_id)
                continue
            epochs = [f"trainer.max_epochs={self.epochs}"] if self.epochs else []
            # validated once, after the last epoch (the demo exports the last weights; a validation each epoch cost
            # as much as the epoch's training on 2 cores)
            once = f"trainer.check_val_every_n_epoch={self.qff_epochs()}"
            self._cli(
                ["train", f"experiment={experiment}", f"run_id={run_id}", "resume=auto", *self.common, *epochs, once]
            )

    def qff_epochs(self) -> int:
        """The QFF's training epochs: `--epochs`, else the demo experiments' own."""
        from qkvqa.config.load import compose

        return self.epochs or int(compose(TRAINING["per_layer"], [], self.common).trainer.max_epochs)

    def reuse_command(self) -> str:
        """An evaluation of one's own on the demo's world that reads the demo's embeddings and index (its world and
        cache folders, its trained QFF): copied, it embeds nothing again."""
        return " ".join(
            [
                "qkvqa evaluate experiment=demo/evaluate",
                *self.common,
                f"qff.checkpoint={self.runs / 'demo-qff-per_layer' / 'qff'}",
                "run_id=my-eval",
            ]
        )

    def settings(self) -> dict[str, tuple]:
        """The report's rows: SETTINGS, and with the real generator the extractive reader's reference row."""
        return {**SETTINGS, REFERENCE[0]: REFERENCE[1]} if self.real_models else dict(SETTINGS)

    def evaluate(self) -> dict[str, Path]:
        done = {}
        for index, (label, (trained, overrides)) in enumerate(self.settings().items()):
            run_id = f"demo-eval-{index}"
            # A run finished before evaluations wrote traces.jsonl is resumed: it is re-scored and writes them.
            if not _finished(self.runs, run_id) or not (self.runs / run_id / "traces.jsonl").exists():
                checkpoint = [f"qff.checkpoint={self.runs / f'demo-qff-{trained}' / 'qff'}"] if trained else []
                self._cli(
                    [
                        "evaluate",
                        "experiment=demo/evaluate",
                        f"run_id={run_id}",
                        "resume=auto",
                        *self.common,
                        *self.models,
                        *checkpoint,
                        *overrides,
                    ]
                )
            done[label] = self.runs / run_id
        return done

    def gold_and_multi(self) -> tuple[dict[str, set[str]], set[str]]:
        world = json.loads((self.world / "world.json").read_text(encoding="utf-8"))
        rows = world["questions"]["evqa/test.csv"]
        rows = [r for r in rows if "data_id" in r and r["question_type"] != "2_hop"]  # recall: single-hop rows
        gold = {r["data_id"]: set(r["gold_urls"]) for r in rows}
        multi = {r["data_id"] for r in rows if len(r["image_entities"]) > 1}
        return gold, multi

    def report(self, settings: dict[str, Path]) -> Path:
        import torch

        from qkvqa.config.load import compose
        from qkvqa.run.job import run_job

        cfg = compose("demo/evaluate", [], [*self.common, "run_id=demo", "resume=auto"])
        with run_job(cfg, "demo") as job:
            run_dir = job.run.run_dir
            gold, multi = self.gold_and_multi()
            rows = comparison_rows(settings, gold, multi)
            table = markdown_table(rows)
            plot_recall(rows, run_dir / "recall_at_k.png")
            plot_training({f"focus: {f}": self.runs / f"demo-qff-{f}" for f in TRAINING}, run_dir / "training.png")
            from qkvqa.inspect.site import build_site

            site = build_site(settings[INSPECT[0]], out=run_dir / "inspect", compare=settings[INSPECT[1]])
            world = json.loads((self.world / "world.json").read_text(encoding="utf-8"))
            retriever = self.retriever
            lines = [
                "# qkvqa demo",
                "",
                WHAT_IS_REAL if self.real_models else TINY_MODELS,
                "",
                HONEST,
                "",
                f"Synthetic world: {world['counts']['entities']} entities, seed {self.seed}, "
                f"{len(gold)} test questions ({len(multi)} with several entities in the image)"
                + (
                    f"; every row evaluates the same seeded sample of {self.questions} of them (`--questions`)."
                    if self.questions
                    else "."
                ),
                "",
                "## The method stage by stage on the test split",
                "",
                table,
                "",
                "## Goals",
                "",
                *goal_lines(rows, SETTINGS, miss_reasons(settings[INSPECT[0]], settings[INSPECT[1]], gold, multi)),
                "",
                "## Choices made to fit the time",
                "",
                f"- Stage 1's image encoder: {retriever.get('steps')} InfoNCE steps of {retriever.get('batch_size')} "
                f"anchors (a quarter training-question images, a quarter KB images, half compositions of 2-3 KB "
                f"images, as the world's multi-entity photos), in-batch negatives, {retriever.get('query_images')} "
                f"training-question images and {retriever.get('kb_images')} KB images, targetpad preprocessing "
                f"(the multi-entity photos padded to a square, not cut to their middle); loss "
                f"{retriever.get('train_loss_first_tenth')} -> {retriever.get('train_loss_last_tenth')} (first and "
                f"last tenth of the steps; chance {retriever.get('chance_loss')}), `{retriever.get('dir')}`.",
                f"- QFF: {self.qff_epochs()} epochs, validated once after the last, hard negatives mined from the "
                "trained stage 1.",
                "- Generator: "
                + (
                    "SmolLM2-135M-Instruct, greedy, at most 16 new tokens, batches of 8 questions."
                    if self.real_models
                    else "the extractive reader (tiny run)."
                ),
                f"- CPU threads: {torch.get_num_threads()} intra-op threads per stage (`make demo` leaves torch at the "
                "core count; the stages run one at a time).",
                "",
                "R@K: the gold article is in the top K after the filter. R@1 multi-entity: the same on the "
                "questions whose image shows 2-3 entities, where only the question tells which is meant. "
                "Section R@1: the best-scored section of the top-1 article is the evidence section. Answer in "
                "context: a reference answer appears in the context given to the generator. Context tokens: "
                "generator tokens. Accuracy E-VQA: the official E-VQA scorer as configured (eval.judge em_only: "
                "its exact-match stage with the multi-answer overlap rule; no BEM weights ship in a wheel, a tiny "
                "random BEM would be noise). Accuracy EM: the answer equals a reference after the official "
                "normalisation. s/q: seconds per question per stage (CPU).",
                "",
                "![Recall@K](recall_at_k.png)",
                "",
                "![QFF training](training.png)",
                "",
                f"Question by question: [inspect/index.html](inspect/index.html) (`qkvqa inspect`, {INSPECT[0]} "
                f"compared with {INSPECT[1]}: {site.flips['right_to_wrong']} questions right -> wrong, "
                f"{site.flips['wrong_to_right']} wrong -> right; docs/inspect.md).",
                "",
                "## Stage times of this demo run",
                "",
                "\n".join(f"- {title}: {seconds:.0f} s" for title, seconds in self.timings.items()),
                "",
                "Runs: " + ", ".join(f"`{r['run_dir']}`" for r in rows),
                "",
                "## The world, to reuse",
                "",
                f"The synthetic world is in `{self.world}`, its KB embeddings and stage-1 index in "
                f"`{self.out / 'cache'}`. An evaluation of your own on it reads them (nothing is embedded "
                f"again) with the demo's paths:",
                "",
                f"    {self.reuse_command()}",
                "",
            ]
            report = run_dir / "report.md"
            atomic_write_text(report, "\n".join(lines))
            job.record.update_summary({f"demo/{r['setting']}/{k}": r[k] for r in rows for k in COLUMNS[1:]})
        print("\n" + table + "\n")
        print(f"report: {report}")
        print(f"inspect: {site.index_html.as_uri()}")
        print(
            f"world: {self.world} (embeddings and index: {self.out / 'cache'}); evaluate on it without "
            f"re-embedding:\n  {self.reuse_command()}"
        )
        return report

    def run(self) -> Path:
        once = OncePerRun()  # the world's missing images are warned once, not per evaluation
        handlers = logging.getLogger("qkvqa").handlers
        for handler in handlers:
            handler.addFilter(once)
        try:
            return self._run()
        finally:
            for handler in handlers:
                handler.removeFilter(once)

    def _run(self) -> Path:
        self.step(1, "synthetic world", self.make_world)
        self.step(2, "stage 1: train the image encoder on the train split (InfoNCE)", self.pretrain_retriever)
        self.step(3, "stage 1: embed the KB and build the index", self.stage1)
        self.step(4, "train the QFF, with and without question focus (hard negatives mined from stage 1)", self.train)
        settings: dict[str, Path] = {}
        self.step(
            5, "evaluate: retrieve -> filter -> CDA -> generate -> score", lambda: settings.update(self.evaluate())
        )
        report: list[Path] = []
        self.step(6, "comparison table, plots and report", lambda: report.append(self.report(settings)))
        return report[0]
