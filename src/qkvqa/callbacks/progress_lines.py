"""Plain progress lines of fit, validation and predict on rank zero (`ProgressLines`), and the fit-start note (`FitStartNote`)."""

from __future__ import annotations

import math
from typing import Any, Optional

import lightning.pytorch as pl
import torch

from qkvqa.utils.logging import get_logger
from qkvqa.utils.progress import ProgressLines as Lines
from qkvqa.utils.progress import format_rate

log = get_logger("qkvqa.progress")


def batch_size_of(batch: Any) -> Optional[int]:
    """Samples in a batch: a qkvqa batch's `size`, else Lightning's guess from the first tensor (None when unknown)."""
    if isinstance(batch, dict) and isinstance(batch.get("size"), int):
        return batch["size"]
    from lightning.pytorch.utilities.data import extract_batch_size

    try:
        return int(extract_batch_size(batch))
    except Exception:  # a batch without tensors: no sample rate
        return None


def planned_steps(trainer: pl.Trainer) -> Optional[float]:
    """The optimizer steps this fit ends at: trainer.max_steps, else Lightning's estimate (None when unbounded)."""
    if trainer.max_steps and trainer.max_steps > 0:
        return float(trainer.max_steps)
    try:
        steps = float(trainer.estimated_stepping_batches)
    except Exception:  # an iterable loader of unknown length
        return None
    return steps if math.isfinite(steps) else None


class ProgressLines(pl.Callback):
    """In place of Lightning's bar when the output is a file: a line at least every `every_s` seconds and at every
    `every_fraction` of the planned steps (questions of a prediction), from global rank zero only. Training lines show
    the optimizer step, the epoch (as logged, from 0), the mean loss of the batches since the last line, the
    step and sample rates of this launch (rank zero's samples times the world size: the qkvqa samplers give every
    rank the same batch size) and the ETA; each validation ends with one line of its `val/*` metrics."""

    def __init__(self, every_s: Optional[float] = None, every_fraction: Optional[float] = None):
        self.every_s, self.every_fraction = every_s, every_fraction
        self._train: Optional[Lines] = None
        self._val: Optional[Lines] = None
        self._predict: Optional[Lines] = None
        self._loss_sum: Optional[torch.Tensor] = None
        self._loss_batches = 0
        self._samples = 0
        self._predicted = 0

    # ------------------------------------------------------------------ training
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        self._train = Lines(
            desc="train",
            total=planned_steps(trainer),
            unit="steps",
            initial=trainer.global_step,
            every_s=self.every_s,
            every_fraction=self.every_fraction,
            fields=lambda: self._train_fields(trainer),
        )
        self._samples = 0
        log.info(
            "train: from step %d to %s",
            trainer.global_step,
            f"{self._train.total:.0f}" if self._train.total else "the end of the data",
        )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._train is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):  # summed on the device: no host sync until a line is printed
            loss = loss.detach().float()
            if pl_module.automatic_optimization:  # Lightning hands on the loss divided by the accumulation
                loss = loss * trainer.accumulate_grad_batches
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self._loss_batches += 1
        self._samples += batch_size_of(batch) or 0
        self._train.advance_to(trainer.global_step)

    def _train_fields(self, trainer: pl.Trainer) -> list[str]:
        fields = [f"epoch {trainer.current_epoch}"]
        if self._loss_sum is not None and self._loss_batches:
            fields.append(f"loss {self._loss_sum.item() / self._loss_batches:.4f}")
            self._loss_sum, self._loss_batches = None, 0
        elapsed = max(self._now() - self._train.start, 1e-9) if self._train is not None else 0.0
        if self._samples and elapsed:
            per_s = self._samples * trainer.world_size / elapsed
            ranks = f" ({trainer.world_size} ranks)" if trainer.world_size > 1 else ""
            fields.append(f"{format_rate(per_s)} samples/s{ranks}")
        return fields

    @staticmethod
    def _now() -> float:
        import time

        return time.monotonic()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._train is not None:
            self._train.close()
            self._train = None

    # ------------------------------------------------------------------ validation
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        total = sum(trainer.num_val_batches) if trainer.num_val_batches else None
        # time-based lines only: a validation every few steps would print ten lines each at the fraction marks
        self._val = Lines(
            desc=f"validate at step {trainer.global_step}",
            total=total or None,
            unit="batches",
            every_s=self.every_s,
            every_fraction=0.0,
        )

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._val is not None:
            self._val.update(1)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val is None:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        self._val.fields = lambda: [", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items()))]
        self._val.emit(done=True)
        self._val.closed = True
        self._val = None

    # ------------------------------------------------------------------ prediction (qkvqa evaluate)
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        total = sum(trainer.num_predict_batches) if trainer.num_predict_batches else None
        self._predicted = 0
        self._predict = Lines(
            desc="predict",
            total=total or None,
            unit="batches",
            every_s=self.every_s,
            every_fraction=self.every_fraction,
            fields=lambda: self._predict_fields(trainer),
        )

    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._predict is None:
            return
        self._predicted += int(outputs) if isinstance(outputs, int) else (batch_size_of(batch) or 0)
        self._predict.update(1)

    def _predict_fields(self, trainer: pl.Trainer) -> list[str]:
        elapsed = max(self._now() - self._predict.start, 1e-9) if self._predict is not None else 0.0
        ranks = f" on rank 0 of {trainer.world_size}" if trainer.world_size > 1 else ""
        return [f"{self._predicted} questions{ranks}, {format_rate(self._predicted / elapsed)} questions/s"]

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._predict is not None:
            self._predict.close()
            self._predict = None


def eval_mode_roots(module: torch.nn.Module) -> list[tuple[str, int]]:
    """(name, modules inside) of each outermost submodule in eval mode (its parent is in train mode)."""
    roots: list[tuple[str, int]] = []
    for name, sub in module.named_modules():
        if sub.training or any(name == r or name.startswith(r + ".") for r, _ in roots):
            continue
        roots.append((name, sum(1 for _ in sub.modules())))
    return roots


class FitStartNote(pl.Callback):
    """One log line in place of Lightning's model summary (trainer.enable_model_summary=false): the parameters, and the
    submodules that start training in eval mode (a frozen ViT), where Lightning only warns 'N modules in eval mode'."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        total = sum(p.numel() for p in pl_module.parameters())
        trainable = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        roots = eval_mode_roots(pl_module)
        frozen = (
            (
                "; in eval mode from the start, as the model set them (a frozen part: no dropout, fixed norms): "
                + ", ".join(f"{name} ({n} modules)" for name, n in roots)
            )
            if roots
            else ""
        )
        log.info("%s: %s parameters, %s trainable%s", type(pl_module).__name__, f"{total:,}", f"{trainable:,}", frozen)
