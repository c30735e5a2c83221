"""`qkvqa sweep FILE.yaml`: run a W&B-format sweep offline (subprocess per trial) or with `wandb agent`."""

from __future__ import annotations

import argparse
import shlex
import sys

DESCRIPTION = """\
Run a sweep written in the W&B sweep format (program, method, metric, parameters with dotted config
keys, command). One file drives both backends:

  --backend local (default, offline): every trial is its own subprocess, run_id=<sweep>-tNNN,
      resume=auto and paths.checkpoints_root are added to each trial's overrides, WANDB_MODE is
      inherited. CHECKPOINTS/sweeps/<sweep>/ holds sweep_manifest.json, logs/tNNN.log and, at the
      end, comparison.csv / comparison.md sorted by metric.goal. A rerun skips finished trials
      (failed ones too unless --retry-failed). grid and random only; random needs --count.
      --gpus-per-trial N gives each trial N devices of the pool (--gpus, else CUDA_VISIBLE_DEVICES,
      else every GPU) through CUDA_VISIBLE_DEVICES, so 8 one-GPU trials share an 8-GPU node.
  --backend slurm: submits the trials that are not done and not queued as one `sbatch --array` job,
      one trial per task (`srun`, so --sbatch-arg=--ntasks-per-node=4 makes a 4-rank DDP trial);
      --parallel N throttles the array (%N), --gpus-per-trial N asks --gres=gpu:N, --sbatch-arg adds
      any sbatch option. Run directories, run ids and W&B runs are named as with local. A rerun
      reads back each task (squeue, then the trial's status.json) and submits only unfinished
      trials; --wait waits for the array and writes the comparison.
  --backend wandb: creates the sweep on the W&B server and runs `wandb agent` (needs a login).
      --dry-run prints the agent commands; docs/sweeps.md has an sbatch recipe for agents.

The command must pass the parameters with ${args_no_hyphens} (quote the macros in a [...] list), e.g.
  command: ["${env}", "${interpreter}", -m, qkvqa.cli, evaluate, experiment=eval/evqa_qwen, "${args_no_hyphens}"]
"""


# The trial commands whose config the runner composes to tell whether a trial's run is still the planned one, each with
# the module whose SHORTHANDS its handler expands first (`split=X`, ...).
COMPOSED_COMMANDS = {
    "train": None,
    "evaluate": "qkvqa.cli.evaluate",
    "retrieve": "qkvqa.cli.embed",
    "mine": "qkvqa.cli.embed",
    "rerank": "qkvqa.cli.embed",
    "embed": "qkvqa.cli.embed",
}


def compose_command(tokens: list[str]):
    """The config `qkvqa TOKENS` composes to in the current directory, as its handler composes it (shorthands
    included), or None for a command not in COMPOSED_COMMANDS; ConfigError when it does not parse or compose. The
    sweep runners read their trials' configs with it (`LocalSweep(compose=...)`)."""
    if not tokens or tokens[0] not in COMPOSED_COMMANDS:
        return None
    import importlib

    from qkvqa.cli.embed import expand_shorthands
    from qkvqa.cli.main import build_parser
    from qkvqa.config.cli import config_from_args
    from qkvqa.errors import ConfigError

    try:
        args = build_parser().parse_args(tokens)
    except SystemExit:
        raise ConfigError(f"`qkvqa {shlex.join(tokens)}` does not parse") from None
    module = COMPOSED_COMMANDS[tokens[0]]
    shorthands = getattr(importlib.import_module(module), "SHORTHANDS") if module else None
    if shorthands:
        args.overrides = expand_shorthands(args.overrides, shorthands)
    return config_from_args(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `sweep` command."""
    parser = subparsers.add_parser(
        "sweep",
        help="run a hyperparameter sweep (offline runner or wandb agent)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("sweep_file", metavar="SWEEP.yaml", help="sweep file, e.g. experiments/sweeps/alpha_sweep.yaml")
    parser.add_argument(
        "--backend",
        choices=["local", "slurm", "wandb"],
        default="local",
        help="local: offline subprocess runner (default); slurm: a SLURM job array; wandb: W&B sweep + `wandb agent`",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="trials (local; default 1, or as many as the GPUs allow with --gpus-per-trial), "
        "array tasks at once (slurm; default no limit) or agents (wandb; default 1)",
    )
    parser.add_argument(
        "--gpus-per-trial",
        type=int,
        default=0,
        metavar="N",
        help="GPUs each trial gets (local: CUDA_VISIBLE_DEVICES from the pool; slurm: --gres=gpu:N)",
    )
    parser.add_argument(
        "--gpus",
        metavar="LIST",
        help="local: the device pool, e.g. 0,1,2,3 (default CUDA_VISIBLE_DEVICES, else all GPUs)",
    )
    parser.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="OPT",
        help="slurm: an sbatch option for the array, repeatable, e.g. --sbatch-arg=--partition=gpu "
        "--sbatch-arg=--time=04:00:00",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="slurm: wait until no task of the sweep is queued or running, then write the comparison",
    )
    parser.add_argument("--wait-timeout", type=float, metavar="S", help="slurm --wait: give up after S seconds")
    parser.add_argument(
        "--count",
        type=int,
        metavar="N",
        help="number of trials: the first N grid points, or N random draws (split between agents)",
    )
    parser.add_argument(
        "--seed", type=int, metavar="S", help="random-search seed (default: the one recorded in the manifest, else 0)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the file and print every trial's command (local) or the agent commands (wandb)",
    )
    parser.add_argument(
        "--sweep-dir",
        metavar="DIR",
        help="where the manifest, logs and comparison go (default CHECKPOINTS/sweeps/<sweep name>)",
    )
    parser.add_argument(
        "--checkpoints-root",
        default="checkpoints",
        metavar="DIR",
        help="paths.checkpoints_root shared by every trial (default: checkpoints)",
    )
    parser.add_argument("--retry-failed", action="store_true", help="run failed trials again (local)")
    parser.add_argument("--project", help="W&B project of the sweep (wandb; default: the file's, else qkvqa)")
    parser.add_argument("--entity", help="W&B entity of the sweep (wandb; default: the file's, else yours)")
    parser.add_argument("--sweep-id", help="join an existing W&B sweep instead of creating one (wandb)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.sweep.spec import check_value_types, load_sweep

    spec = load_sweep(args.sweep_file)
    check_value_types(spec, args.seed or 0)
    if args.backend == "wandb":
        return _run_wandb(args, spec)
    return _run_local(args, spec)


def _run_local(args: argparse.Namespace, spec) -> int:
    from qkvqa.sweep.local import LocalSweep
    from qkvqa.sweep.slurm_array import SlurmSweep

    common = dict(
        checkpoints_root=args.checkpoints_root,
        sweep_dir=args.sweep_dir,
        count=args.count,
        seed=args.seed,
        retry_failed=args.retry_failed,
        gpus_per_trial=args.gpus_per_trial,
        compose=compose_command,
    )
    if args.backend == "slurm":
        sweep = SlurmSweep(spec, parallel=args.parallel, sbatch_args=args.sbatch_arg, **common)
    else:
        sweep = LocalSweep(spec, parallel=args.parallel, gpus=args.gpus.split(",") if args.gpus else None, **common)
    if args.dry_run:
        print(
            f"sweep {spec.name}: {spec.method}, {len(sweep.trials)} trial(s), seed {sweep.seed}, "
            f"sweep dir {sweep.sweep_dir}"
        )
        plan = sweep.plan()
        for trial, action in plan:
            print(f"{trial.trial_id}  {action:<16} {shlex.join(sweep.argv(trial))}")
        if args.backend == "slurm":
            print(f"--- array script ({shlex.join(['sbatch', *args.sbatch_arg])}):")
            print(sweep.script([t.index for t, action in plan if action == "run"]))
        if any(action.startswith("changed") for _, action in plan):
            from qkvqa.run.sweep_manifest import Manifest
            from qkvqa.sweep.local import changed_trials_error

            # the sweep itself would refuse to run: say why, as it would
            print(
                f"qkvqa sweep: error: {changed_trials_error(spec, sweep.changes(Manifest.load(sweep.sweep_dir)))}",
                file=sys.stderr,
            )
            return 2
        return 0
    result = sweep.run(wait=args.wait, timeout_s=args.wait_timeout) if args.backend == "slurm" else sweep.run()
    failed = [tid for tid, t in result.manifest.trials.items() if t["status"] == "failed"]
    live = sum(t["status"] in ("queued", "running") for t in result.manifest.trials.values())
    print(
        f"sweep {spec.name}: {result.count('finished')} finished, {len(failed)} failed, "
        f"{len(result.skipped)} skipped{f', {live} queued or running on SLURM' if live else ''}; "
        f"manifest {result.manifest.path}; comparison {result.comparison}"
    )
    for tid in failed:
        print(f"  failed {tid}: {result.sweep_dir / result.manifest.trials[tid]['log']}", file=sys.stderr)
    return 1 if failed else 0


def _run_wandb(args: argparse.Namespace, spec) -> int:
    import json

    from qkvqa.sweep.wandb_backend import (
        agent_commands,
        resolve_project,
        run_wandb_sweep,
        sweep_path,
        wandb_sweep_config,
    )

    if args.dry_run:
        project, entity = resolve_project(spec, args.project, args.entity)
        print(json.dumps(wandb_sweep_config(spec, project, entity), indent=2))
        for cmd in agent_commands(
            sweep_path(entity, project, args.sweep_id or "<sweep id>"), args.parallel or 1, args.count
        ):
            print(shlex.join(cmd))
        return 0
    return run_wandb_sweep(
        spec,
        project=args.project,
        entity=args.entity,
        parallel=args.parallel or 1,
        count=args.count,
        sweep_id=args.sweep_id,
    )
