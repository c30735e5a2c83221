"""`PipelineEvaluator`: runs the KB-VQA pipeline over a split with `Trainer.predict`, appending answers as it goes.

The pipeline's own LightningModule, beside the evaluation recipe that runs it (`qkvqa.pipeline.evaluate`); the QFF's
trainer is `qkvqa.models.qff_module.QFFTrainer`."""

from __future__ import annotations

from typing import Any, Iterable

import lightning.pytorch as pl

from qkvqa.pipeline.pipeline import KBVQAPipeline, QuestionInput
from qkvqa.pipeline.predictions import PredictionStore
from qkvqa.retrieval.results import Retrieved


class PipelineEvaluator(pl.LightningModule):
    """Orchestrates the stages per batch and records every answer (and every skipped question) once.

    It holds no model math: the pipeline's filter, CDA selector and generator do the work. Rows go
    to this rank's append-only part file as soon as a batch is done; rank zero merges the parts
    after `predict` and a barrier (see `qkvqa.pipeline.evaluate.run_evaluation`).
    """

    def __init__(
        self,
        pipeline: KBVQAPipeline,
        store: PredictionStore,
        retrieved: dict[str, Retrieved],
        dataset: str,
        done_ids: Iterable[str] = (),
    ):
        super().__init__()
        self.pipeline = pipeline
        self.store = store
        self.retrieved = retrieved
        self.dataset = dataset
        # Answered before this attempt: a batch that holds some of them runs whole (EvaluationDataModule's fixed
        # batches, for the same floats), and only its other rows are written.
        self.done_ids = set(done_ids)
        # Fewer remaining batches than ranks (a small split, the end of a resumed run) leaves a rank with none:
        # that rank has nothing to do, which Lightning refuses by default.
        self.allow_zero_length_dataloader_with_multiple_devices = True

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> int:
        skipped = [
            {"data_id": qid, "prediction": "", "skipped": "query image missing or unreadable"}
            for qid in batch["dropped_data_ids"]
        ]
        inputs = [
            QuestionInput(
                data_id=qid,
                question=question,
                image=image,
                dataset=self.dataset,
                retrieved=self.retrieved.get(qid, Retrieved()),
            )
            for qid, question, image in zip(batch["data_id"], batch["question"], batch["image"])
        ]
        rows = [row for row in self.pipeline.answer(inputs) + skipped if row["data_id"] not in self.done_ids]
        if rows:
            self.store.append(self.global_rank, rows)
        return len(rows)
