"""`qkvqa train`: contrastive training of the question-focused filter as a run (checkpoints, W&B, resume, DDP)."""

from __future__ import annotations

import argparse
import json

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add the `train` command."""
    parser = subparsers.add_parser(
        "train",
        help="train the QFF (InfoNCE over 1 positive + hard negatives)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train the question-focused filter as one run in checkpoints/<run_id>/: builds\n"
        "components.qformer (with the qff: switches), the hard-negative DataModule (qff.negatives,\n"
        "qff.val_negatives from `qkvqa mine`, else mined now into the run directory from the stage-1\n"
        "results; qff.vit_cache from `qkvqa cache-vit` to skip the ViT)\n"
        "and the QFFTrainer, then fits with the trainer: section. Writes last.ckpt and the best\n"
        "checkpoint (checkpoint.monitor, e.g. val/article_r1), metrics.csv, summary.json, W&B, and\n"
        "the trained QFF as safetensors in RUN/qff (use it with qff.checkpoint=RUN/qff).\n\n"
        "  qkvqa train experiment=evqa_qff preset=gpu\n"
        "  qkvqa train experiment=evqa_qff run_id=X resume=auto       # continue a run\n"
        "  qkvqa train experiment=evqa_qff trainer.devices=4 trainer.strategy=ddp\n"
        "Multi-node (torchrun, SLURM): docs/training.md.",
    )
    add_override_args(parser)
    parser.set_defaults(func=_run, opens_run=True)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.utils.command_line import remember

    remember("train", args.overrides)  # the resume command a stop prints is this one, run_id=... resume=auto
    cfg = config_from_args(args)  # a config typo is reported before the torch import (seconds)
    summary = train_qff(cfg)
    if summary:
        print(
            json.dumps(
                {
                    k: v
                    for k, v in summary.items()
                    if k.startswith(("val/", "qff/", "global_step", "best_model", "last_model"))
                }
            )
        )
    return 0


def train_qff(cfg, callbacks=()) -> dict:
    """Train the QFF of `cfg` as one run (extra Lightning `callbacks` beside the export); the summary on rank zero."""
    steps, schedule = cfg.trainer.max_steps, cfg.qff.schedule_steps
    if schedule and steps and steps > schedule:
        from qkvqa.errors import ConfigError

        raise ConfigError(
            f"trainer.max_steps={steps} runs past the OneCycle schedule of qff.schedule_steps={schedule} "
            f"(it would crash at step {schedule + 1} after training, a resume included): train at most "
            f"{schedule} steps, or plan qff.schedule_steps >= {steps} in a new run"
        )
    from qkvqa.run.trainer import finished_run_summary

    finished = finished_run_summary(cfg)  # resume=auto on a finished run: said, nothing built or touched
    if finished is not None:
        return finished

    from qkvqa.cli.cache_vit import miner_for
    from qkvqa.config.schema import qff_settings
    from qkvqa.data_modules.qff_train import QFFTrainDataModule, settings_from_config
    from qkvqa.models.qff_module import QFFExport, QFFTrainer
    from qkvqa.qff.builder import build_qff_component
    from qkvqa.qff.vit_cache import vision_fingerprint
    from qkvqa.run.trainer import check_hardware, fit

    check_hardware(cfg, ["qformer"])
    # built on the CPU; the trainer moves it to each rank's device (no copy of the model on GPU 0 per rank)
    from qkvqa.qff.pretrain_here import resolve_qformer_spec

    # init pretrained_here: the text layers pretrained on this config's corpus first (cached; qkvqa pretrain-qformer)
    qformer = {**resolve_qformer_spec(cfg), "device": "cpu"}
    qff = qff_settings(cfg.qff)  # the one settings object: the component, the trainer and the checkpoint read it
    component = build_qff_component(qformer, qff)
    fingerprint = vision_fingerprint(component.model, component.image_processor) if qff.freeze_vit else None
    datamodule = QFFTrainDataModule(
        cfg.data,
        settings_from_config(cfg, component, fingerprint),
        component.tokenizer,
        component.image_processor,
        miner=miner_for(cfg),
    )
    # the spec and the settings travel in each checkpoint's hyper-parameters: QFFTrainer.load_from_checkpoint(path)
    # rebuilds the model
    module = QFFTrainer(component.model, qff, model_spec={"qformer": qformer}, vision_fingerprint=fingerprint)
    return fit(
        cfg,
        module,
        datamodule,
        command="train",
        callbacks=[QFFExport(component, datamodule), *callbacks],
        batch_size=cfg.data.batch_size,
    )
