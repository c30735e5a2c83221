"""QFFTrainer: the LightningModule that trains the question-focused filter contrastively (method.md §3); orchestration only.

Per sample, the question pass encodes (question, query image); the section pass encodes the positive
and the hard negatives, focused on the question; the logits are the late-interaction scores over
the temperature, `s / tau`, and the loss is InfoNCE with the positive as the target (optionally with
the other samples' positives as in-batch negatives). All model math lives in `qkvqa.qff`.

Validation reports, per question (exactly once under DDP, keyed by data_id):
`val/section_r1` (the evidence section outscores the sample's negatives), `val/article_r1` (after
reranking the stage-1 top-K with alpha fusion, the gold article comes first; the default monitor)
and `val/stage1_article_r1` (the same before the QFF).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from qkvqa.config.schema import QFFConfig, qff_settings
from qkvqa.errors import ConfigError, MissingWeightsError, StaleArtifactError
from qkvqa.metrics.torchmetrics_classes import PerQuestionMean
from qkvqa.qff.scorers import DEFAULT_SCORER, resolve_scorer, scorer_from_qff
from qkvqa.qff.scoring import in_batch_scores, rerank_hits
from qkvqa.run.steps import optimizer_steps
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

VISION_PREFIX = "model.base.vision_model."
# Parameters outside the QFF objective: the ITC/ITM heads, and the last layer's text FFN, whose
# output never reaches the query tokens that are scored. Frozen, so DDP sees no unused parameter.
UNUSED_HEADS = ("itm_head", "vision_projection", "text_projection")


def trainer_qff(settings: Any, model_spec: Optional[dict] = None) -> tuple[QFFConfig, Optional[str]]:
    """(the `qff:` section as the one `QFFConfig`, the recorded ViT fingerprint) from a QFFTrainer's `settings`
    hyper-parameter: a QFFConfig, or its plain dict (`asdict`). Checkpoints written before one settings object hold
    the trainer's own copy of 16 fields and `vision_fingerprint`: read with the `qff` section their `model_spec`
    recorded, the scorer's `qff.<key>` options (`SectionScorer.QFF_KEYS`) back at their keys. Today the section is
    `settings` alone: a `qff` in `model_spec` beside today's settings is refused (two copies, one would be ignored)."""
    legacy = not isinstance(settings, QFFConfig) and "vision_fingerprint" in settings
    if not legacy and "qff" in (model_spec or {}):
        raise ConfigError(
            "QFFTrainer: model_spec holds a qff section beside the settings; the qff section is the settings "
            "(one QFFConfig): leave it out of model_spec"
        )
    if isinstance(settings, QFFConfig):
        return settings, None
    settings = dict(settings)
    if not legacy:
        return qff_settings(settings), None
    fingerprint = settings.pop("vision_fingerprint")
    options = dict(settings.get("scorer_options") or {})
    for option, key in resolve_scorer(settings.get("scorer") or DEFAULT_SCORER).QFF_KEYS.items():
        if option in options:
            settings[key] = options.pop(option)
    settings["scorer_options"] = options
    return qff_settings({**(model_spec or {}).get("qff", {}), **settings}), fingerprint


def freeze_outside_objective(model) -> list[str]:
    """Freeze the parameters that the contrastive loss cannot reach; returns their names."""
    frozen = []
    last = model.base.qformer.encoder.layer[-1]
    modules = [(name, getattr(model.base, name)) for name in UNUSED_HEADS if hasattr(model.base, name)]
    for name in ("intermediate", "output"):
        if getattr(last, name, None) is not None:
            modules.append((f"qformer.encoder.layer.{model.num_layers - 1}.{name}", getattr(last, name)))
    for prefix, module in modules:
        for pname, param in module.named_parameters():
            if param.requires_grad:
                param.requires_grad_(False)
                frozen.append(f"{prefix}.{pname}")
    return frozen


def model_architecture(model) -> dict:
    """A `model_spec` that rebuilds `model`'s shape (weights from a checkpoint): base config, focus, gate, switches."""
    return {
        "architecture": {
            "base_config": model.base.config.to_dict(),
            "focus": model.focus,
            "gate": model.gate,
            "freeze_vit": model.freeze_vit,
            "gradient_checkpointing": model.gradient_checkpointing,
        }
    }


def rebuild_model(spec: dict, qff: QFFConfig, fingerprinted: bool) -> tuple[nn.Module, Optional[str]]:
    """The QFFModel a `model_spec` describes, and the fingerprint of its frozen ViT (None unless `fingerprinted`):
    `{"qformer"}` builds the component with the `qff` settings, its ViT weights included; `{"architecture"}` only
    the shape."""
    if "qformer" in spec:
        from qkvqa.qff.builder import build_qff_component
        from qkvqa.qff.vit_cache import vision_fingerprint

        component = build_qff_component({**spec["qformer"], "device": "cpu"}, qff)
        fingerprint = vision_fingerprint(component.model, component.image_processor) if fingerprinted else None
        return component.model, fingerprint
    if fingerprinted:
        raise MissingWeightsError(
            "this QFFTrainer checkpoint leaves the frozen ViT out and records no components.qformer "
            "spec to rebuild it from: pass model= (build_qff_component(cfg.components.qformer, "
            "cfg.qff).model) to load_from_checkpoint"
        )
    from transformers import Blip2Config, Blip2ForImageTextRetrieval

    from qkvqa.qff.model import resolve_focus

    arch = spec["architecture"]
    base = Blip2ForImageTextRetrieval(Blip2Config.from_dict(arch["base_config"]))
    return resolve_focus(arch["focus"])(
        base,
        focus=arch["focus"],
        freeze_vit=arch["freeze_vit"],
        gate=arch["gate"],
        gradient_checkpointing=arch["gradient_checkpointing"],
    ), None


class QFFTrainer(pl.LightningModule):
    """Contrastive training of a `QFFModel` (see the module docstring).

    `QFFTrainer.load_from_checkpoint(path)` works without arguments: the checkpoint's hyper-parameters hold the
    settings and a `model_spec` (plain values, so `weights_only` loading still works) that rebuilds the model.
    """

    def __init__(
        self,
        model=None,
        settings: QFFConfig | dict | None = None,
        model_spec: Optional[dict] = None,
        vision_fingerprint: Optional[str] = None,
    ):
        """`model`: the QFFModel to train; `settings`: the `qff:` section, the one `QFFConfig` every command reads
        (`qkvqa.config.schema.qff_settings(cfg.qff)`; or its plain dict, as the checkpoint holds it).
        `vision_fingerprint`: set when the frozen ViT is left out of checkpoints. `model_spec`
        (`{"qformer": components.qformer}`, plain values; `qkvqa train` passes it) is recorded so that a checkpoint
        rebuilds the model with these settings, its frozen ViT included, and that ViT is checked against the
        checkpoint's; without it the model's architecture is recorded. `model=None` rebuilds from `model_spec`."""
        super().__init__()
        if settings is None:
            raise ConfigError("QFFTrainer needs settings: QFFTrainer(model, qff_settings(cfg.qff))")
        qff, recorded = trainer_qff(settings, model_spec)
        vision_fingerprint = vision_fingerprint if vision_fingerprint is not None else recorded
        if model_spec is None and model is None:
            raise ConfigError("QFFTrainer needs a model, or a model_spec to build it from")
        model_spec = model_spec if model_spec is not None else model_architecture(model)
        model_spec = {k: v for k, v in model_spec.items() if k != "qff"}  # an old layout's, now in `qff`: saved once
        self.save_hyperparameters(
            {"settings": asdict(qff), "model_spec": model_spec, "vision_fingerprint": vision_fingerprint},
            logger=False,
        )
        if model is None:
            model, fingerprint = rebuild_model(model_spec, qff, vision_fingerprint is not None)
            if fingerprint is not None:  # on_load_checkpoint compares it with the checkpoint's
                vision_fingerprint = fingerprint
        self.model = model.train()  # Lightning keeps submodule modes: dropout on (a frozen ViT stays in eval)
        self.qff = qff
        self.vision_fingerprint = vision_fingerprint
        # the one scorer of this run: the loss, val/section_r1 and the validation rerank score through it
        self.scorer = scorer_from_qff(qff)
        freeze_outside_objective(model)
        if self.qff.dropout is not None:
            for module in model.modules():
                if isinstance(module, nn.Dropout):
                    module.p = float(self.qff.dropout)
        log_tau = torch.tensor(math.log(self.qff.temperature))
        if self.qff.learnable_temperature:
            self.log_temperature = nn.Parameter(log_tau)
        else:
            self.register_buffer("log_temperature", log_tau, persistent=False)
        self.val_loss = PerQuestionMean()
        self.val_section_r1 = PerQuestionMean()
        self.val_article_r1 = PerQuestionMean()
        self.val_stage1_r1 = PerQuestionMean()
        self.dropped_samples = 0
        self.empty_batches = 0
        self._step_started: Optional[float] = None
        self._resumed_schedule_steps: Optional[int] = None

    @property
    def temperature(self) -> torch.Tensor:
        """tau (learnable ones kept in [0.001, 0.5], as LAVIS clamps its `temp`)."""
        return self.log_temperature.exp().clamp(0.001, 0.5)

    # ------------------------------------------------------------------ forward pieces
    def image_states(self, batch: dict[str, Any]) -> torch.Tensor:
        """ViT states of the batch's distinct images: cached features, or the frozen ViT run once per image."""
        if "image_features" in batch:
            return batch["image_features"]
        return self.model.encode_image(batch["pixel_values"])

    def encode(self, batch: dict[str, Any]):
        """(question encoding, section tokens `[B, N, Q, D]`, image states) of a contrastive batch."""
        states = self.image_states(batch)
        question = self.model.encode_question(
            batch["question"]["input_ids"],
            batch["question"]["attention_mask"],
            states.index_select(0, batch["question_image_index"]),
        )
        b, n = batch["size"], batch["num_candidates"]
        question_index = torch.arange(b, device=states.device).repeat_interleave(n)
        sections = self.model.encode_sections(
            batch["sections"]["input_ids"],
            batch["sections"]["attention_mask"],
            states,
            question,
            image_index=batch["section_image_index"],
            question_index=question_index,
        )
        return question, sections.view(b, n, *sections.shape[1:]), states

    def logits(self, batch: dict[str, Any], question, sections, states) -> torch.Tensor:
        """`[B, N]` scores over tau (positive first); with in-batch negatives, `[B, N + B - 1]`."""
        scores = self.scorer.score(question.tokens[:, None], sections, training=True)
        b = batch["size"]
        if self.qff.in_batch_negatives and b > 1:
            negatives = in_batch_scores(self.model, batch, question, states, self.scorer)
            scores = torch.cat([scores, negatives], dim=1)
        return scores / self.temperature

    @staticmethod
    def contrastive_loss(logits: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """InfoNCE (Eq. 10): cross-entropy of the logits with the positive, column 0, as the target."""
        target = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits.float(), target, reduction=reduction)

    # ------------------------------------------------------------------ training
    def _skip_empty(self, batch: dict[str, Any]) -> Optional[torch.Tensor]:
        """For a batch whose samples were all dropped: None (step skipped), or under DDP a zero loss every rank can reduce."""
        self.empty_batches += 1
        log.warning(
            "skipping an empty batch (%d samples dropped: %s)",
            len(batch["dropped"]),
            ", ".join(sorted({d["reason"] for d in batch["dropped"]})) or "no samples",
        )
        if self.trainer is not None and self.trainer.world_size > 1:
            return sum(p.sum() * 0.0 for p in self.parameters() if p.requires_grad)
        return None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self._step_started is None:
            self._step_started = time.perf_counter()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Optional[torch.Tensor]:
        self.dropped_samples += len(batch["dropped"])
        self.log("train/dropped_samples", float(self.dropped_samples), on_step=True, on_epoch=False)
        if batch["size"] == 0:
            return self._skip_empty(batch)
        question, sections, states = self.encode(batch)
        logits = self.logits(batch, question, sections, states)
        loss = self.contrastive_loss(logits)
        b = batch["size"]
        with torch.no_grad():
            # train/loss per step; train/epoch_loss the epoch's mean over every rank's batches
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True, batch_size=b)
            self.log("train/epoch_loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=b)
            self.log("train/pos_sim", (logits[:, 0] * self.temperature).mean(), on_step=True, batch_size=b)
            # rates in percent, as val/* and eval/* (docs/training.md)
            self.log(
                "train/acc1",
                100.0 * (logits.argmax(dim=1) == 0).float().mean(),
                on_step=True,
                prog_bar=True,
                batch_size=b,
            )
            self.log("train/temperature", self.temperature, on_step=True, batch_size=b)
            gates = self.model.gate_values()
            if gates is not None:  # mean |tanh(gate)| and every layer's tanh(gate)
                self.log("train/gate", gates.abs().mean(), on_step=True, batch_size=b)
                for layer, value in enumerate(gates.tolist() if gates.numel() > 1 else []):
                    self.log(f"train/gate_layer{layer}", value, on_step=True, batch_size=b)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._step_started is not None and isinstance(batch, dict) and batch.get("size"):
            self.log(
                "train/samples_per_s",
                batch["size"] / max(now - self._step_started, 1e-9),
                on_step=True,
                batch_size=batch["size"],
            )
        self._step_started = now

    def parameter_groups(self) -> list[dict]:
        """AdamW groups: the base Q-Former (lr, weight decay), the new focus blocks (lr x new_block_lr_scale,
        weight decay) and their gates (lr x new_block_lr_scale, no weight decay: decay would pull a gate
        back to closed), and a learnable temperature (no weight decay)."""
        qff = self.qff
        blocks, gates = self.model.focus_parameters()
        new = {id(p) for p in blocks + gates}
        base = [p for p in self.model.parameters() if p.requires_grad and id(p) not in new]
        scaled = qff.lr * qff.new_block_lr_scale
        groups = [
            {"name": "qformer", "params": base, "lr": qff.lr, "weight_decay": qff.weight_decay},
            {
                "name": "focus_blocks",
                "params": [p for p in blocks if p.requires_grad],
                "lr": scaled,
                "weight_decay": qff.weight_decay,
            },
            {"name": "focus_gates", "params": [p for p in gates if p.requires_grad], "lr": scaled, "weight_decay": 0.0},
        ]
        if qff.learnable_temperature:
            groups.append({"name": "temperature", "params": [self.log_temperature], "lr": qff.lr, "weight_decay": 0.0})
        return [g for g in groups if g["params"]]

    def on_before_optimizer_step(self, optimizer) -> None:
        """Log the L2 norm of all gradients (before clipping) and of the new focus blocks' (zero while a tanh gate is
        still closed)."""
        if not self.trainer._logger_connector.should_update_logs:
            return  # the norms are only logged every log_every_n_steps
        every = [p.grad.detach() for p in self.parameters() if p.grad is not None]
        if every:
            self.log(
                "train/grad_norm",
                torch.nn.utils.get_total_norm(every, foreach=True).float(),
                on_step=True,
                on_epoch=False,
            )
        blocks, _ = self.model.focus_parameters()
        grads = [p.grad.detach().float().norm() for p in blocks if p.grad is not None]
        if grads:
            self.log("train/focus_grad_norm", torch.stack(grads).norm(), on_step=True, on_epoch=False)

    def configure_optimizers(self):
        qff = self.qff
        optimizer = torch.optim.AdamW(self.parameter_groups(), lr=qff.lr, betas=tuple(qff.betas), eps=qff.eps)
        total = int(qff.schedule_steps or optimizer_steps(self.trainer))
        if self._resumed_schedule_steps is not None and self._resumed_schedule_steps != total:
            raise ConfigError(
                f"the checkpoint's OneCycle schedule spans {self._resumed_schedule_steps} optimizer steps "
                f"but this run plans {total}: a resumed run keeps its schedule, so train at most "
                f"{self._resumed_schedule_steps} steps (trainer.max_steps) or start a new run "
                f"(set qff.schedule_steps up front to plan a schedule longer than one launch)"
            )
        # cycle_momentum=False keeps AdamW's betas as configured (OneCycle would otherwise cycle beta1).
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=[g["lr"] for g in optimizer.param_groups],
            total_steps=total,
            pct_start=qff.pct_start,
            div_factor=qff.div_factor,
            cycle_momentum=False,
        )
        # LearningRateMonitor logs each group's rate as train/lr/<group name> (qformer, focus_blocks, ...)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "train/lr"},
        }

    # ------------------------------------------------------------------ validation
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        if batch["size"] == 0:
            return
        question, sections, states = self.encode(batch)
        logits = self.logits(batch, question, sections, states)
        self.val_loss.update(batch["data_ids"], self.contrastive_loss(logits, reduction="none"))
        self.val_section_r1.update(batch["data_ids"], (logits.argmax(dim=1) == 0).double())
        if "rerank" in batch:
            fused_hits, stage1_hits = rerank_hits(
                self.model,
                batch["rerank"],
                question,
                states,
                self.scorer,
                self.qff.alpha,
            )
            self.val_article_r1.update(batch["data_ids"], fused_hits)
            self.val_stage1_r1.update(batch["data_ids"], stage1_hits)

    def on_validation_epoch_end(self) -> None:
        """Log the per-question metrics, gathered over ranks once (no per-step collective), in percent.

        Each value is already the same on every rank (PerQuestionMean gathers before it computes), so the sync
        Lightning asks for is a max over equal values: the value unchanged, exactly (a mean over 3 ranks could round)."""
        for name, metric, scale in (
            ("val/loss", self.val_loss, 1.0),
            ("val/section_r1", self.val_section_r1, 100.0),
            ("val/article_r1", self.val_article_r1, 100.0),
            ("val/stage1_article_r1", self.val_stage1_r1, 100.0),
        ):
            value = metric.compute()
            if not torch.isnan(value):
                self.log(
                    name, scale * value.float(), prog_bar=name == "val/article_r1", sync_dist=True, reduce_fx="max"
                )
            metric.reset()

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Leave the frozen ViT out of the checkpoint (it is rebuilt from the component); record its fingerprint."""
        if self.vision_fingerprint is None:
            return
        state = checkpoint["state_dict"]
        for key in [k for k in state if k.startswith(VISION_PREFIX)]:
            del state[key]
        checkpoint["qff_frozen_vit"] = {"fingerprint": self.vision_fingerprint, "prefix": VISION_PREFIX}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Note the saved schedule length; put this run's frozen ViT weights back after checking they are the same."""
        schedulers = checkpoint.get("lr_schedulers") or [{}]
        self._resumed_schedule_steps = schedulers[0].get("total_steps")
        frozen = checkpoint.get("qff_frozen_vit")
        if frozen is None:
            return
        if frozen["fingerprint"] != self.vision_fingerprint:
            raise StaleArtifactError(
                "this checkpoint was trained with another frozen ViT (fingerprint "
                f"{frozen['fingerprint'][:19]}...); resume with the same "
                "components.qformer weights"
            )
        for key, value in self.model.base.vision_model.state_dict().items():
            checkpoint["state_dict"][frozen["prefix"] + key] = value


BEST_EXPORT = "qff_best"  # beside RUN/qff (the last weights): the best monitored validation's weights


class QFFExport(pl.Callback):
    """At the end of fit, rank zero saves the trained QFF (safetensors + tokenizer) and the sample counts.

    `RUN/qff` holds the weights after the last step: the paper's QFF is the one at the end of its one-epoch OneCycle
    schedule (method.md section 3; no checkpoint is selected on validation). With `checkpoint.monitor` set and its
    best checkpoint at another step, that checkpoint's weights go beside it as `RUN/qff_best`. The summary
    (`qff/checkpoint`, `qff/step`, `qff/best_checkpoint`, `qff/best_step`, `qff/best_score`) and the log say which is
    which. A run stopped on a signal before its last step exports nothing: its weights are not the trained QFF
    (`last.ckpt` resumes it, and loads as `qff.checkpoint=RUN/last.ckpt` for a look at the partial weights)."""

    def __init__(self, component, datamodule=None):
        self.component = component
        self.datamodule = datamodule

    def on_fit_end(self, trainer: pl.Trainer, pl_module: QFFTrainer) -> None:
        if not trainer.is_global_zero:
            return
        from qkvqa.callbacks.last_checkpoint import LastCheckpoint
        from qkvqa.run.record import RunRecord
        from qkvqa.utils.io import atomic_write_json

        run_dir = Path(trainer.default_root_dir)
        step = trainer.global_step
        if any(isinstance(cb, LastCheckpoint) and cb.preempted for cb in trainer.callbacks):
            RunRecord(run_dir).update_summary({"qff/checkpoint": None, "qff/step": None})
            log.warning(
                "stopped at step %d before the end of training: %s not written (these are not the trained "
                "QFF's weights); resume the run to finish it, or load the partial weights with "
                "qff.checkpoint=%s",
                step,
                run_dir / "qff",
                run_dir / "last.ckpt",
            )
            return
        out = self.component.save_pretrained(run_dir / "qff")
        report = {
            "samples": self.datamodule.sample_report() if self.datamodule is not None else {},
            "dropped_in_batches": pl_module.dropped_samples,
            "empty_batches": pl_module.empty_batches,
        }
        atomic_write_json(run_dir / "qff_samples.json", report)
        best = self._export_best(trainer, pl_module, run_dir)
        RunRecord(run_dir).update_summary(
            {
                "qff/checkpoint": str(out),
                "qff/step": step,
                "qff/weights": "last",
                **best,
                "qff/dropped_in_batches": pl_module.dropped_samples,
                "qff/empty_batches": pl_module.empty_batches,
                **{f"qff/{split}_samples": r["kept"] for split, r in report["samples"].items()},
            }
        )
        log.info(
            "trained QFF saved to %s: the weights after the last step, %d (the paper's QFF: the end of its "
            "schedule); load it with qff.checkpoint=%s",
            out,
            step,
            out,
        )
        if best.get("qff/best_checkpoint"):
            log.info(
                "the best %s (%.4g, step %d) is saved beside it as %s (qff.checkpoint=%s for those weights)",
                best["qff/best_monitor"],
                best["qff/best_score"],
                best["qff/best_step"],
                best["qff/best_checkpoint"],
                best["qff/best_checkpoint"],
            )

    def _export_best(self, trainer: pl.Trainer, pl_module: QFFTrainer, run_dir: Path) -> dict:
        """Write the monitored best checkpoint's weights as RUN/qff_best when it is not the last step's; its summary
        keys (the step and score also when the best is the last step, which `qff/` then holds)."""
        ckpt = trainer.checkpoint_callback
        path = getattr(ckpt, "best_model_path", None)
        if not path or not getattr(ckpt, "monitor", None) or not Path(path).is_file():
            return {}
        from qkvqa.run.checkpoint_io import load_torch_checkpoint

        saved = load_torch_checkpoint(path, map_location="cpu", weights_only=True)
        score = ckpt.best_model_score
        keys = {
            "qff/best_monitor": ckpt.monitor,
            "qff/best_score": float(score) if score is not None else None,
            "qff/best_step": int(saved["global_step"]),
            "qff/best_model_path": str(path),
        }
        if int(saved["global_step"]) == trainer.global_step:
            return {**keys, "qff/best_checkpoint": str(run_dir / "qff")}  # the last step was the best
        model = self.component.model
        state = {k[len("model.") :]: v for k, v in saved["state_dict"].items() if k.startswith("model.")}
        last = {k: v.detach().clone() for k, v in model.state_dict().items() if k in state}
        model.load_state_dict(state, strict=False)
        try:
            out = self.component.save_pretrained(run_dir / BEST_EXPORT)
        finally:
            model.load_state_dict(last, strict=False)  # the module keeps the last weights
        return {**keys, "qff/best_checkpoint": str(out)}
