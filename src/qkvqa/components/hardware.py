"""What GPU this torch build can use here (driver against the build's CUDA), and the one-line warning when a real model would run on the CPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any, Iterable, Optional

from qkvqa.components.hub import WEIGHT_FILE_SUFFIXES
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

# The oldest Linux driver each CUDA line runs on (NVIDIA's CUDA Toolkit release notes, "CUDA Toolkit and Minimum
# Required Driver Version for CUDA Minor Version Compatibility"): a torch +cuXY build needs at least this driver.
MIN_DRIVER = {"11": (450, 80, 2), "12": (525, 60, 13), "13": (580, 65, 6)}


def driver_version() -> Optional[str]:
    """The NVIDIA kernel driver's version (/proc/driver/nvidia/version, else nvidia-smi), or None when none is loaded."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9]+\.[0-9]+(?:\.[0-9]+)?)", f.read())
            if match:
                return match.group(1)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = (
                subprocess.run(
                    [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                .stdout.strip()
                .splitlines()
            )
            return out[0].strip() if out else None
        except (OSError, subprocess.SubprocessError):
            return None
    return None


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def gpu_status() -> dict[str, Any]:
    """{torch, cuda_build, driver, min_driver, driver_ok, available, devices, reason}: whether this torch build can use
    a GPU here and, when it cannot, the reason in words (CPU-only build, no driver, a driver older than the build's
    CUDA needs)."""
    import torch

    build = torch.version.cuda
    driver = driver_version()
    needed = MIN_DRIVER.get(build.split(".")[0]) if build else None
    driver_ok = None if driver is None or needed is None else _parse(driver) >= needed
    available = torch.cuda.is_available()
    devices = []
    if available:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    if available:
        reason = None
    elif build is None:
        reason = f"torch {torch.__version__} is a CPU-only build"
    elif driver is None:
        reason = "no NVIDIA driver is loaded on this machine"
    elif driver_ok is False:
        reason = (
            f"the NVIDIA driver {driver} is older than torch {torch.__version__} (CUDA {build}) needs "
            f"(>= {'.'.join(map(str, needed))}); update the driver or install a torch build of an older CUDA "
            f"(README, 'GPU install')"
        )
    elif os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        reason = f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} hides every GPU"
    else:
        reason = "torch.cuda.is_available() is False"
    return {
        "torch": torch.__version__,
        "cuda_build": build,
        "driver": driver,
        "min_driver": None if needed is None else ".".join(map(str, needed)),
        "driver_ok": driver_ok,
        "available": available,
        "devices": devices,
        "reason": reason,
    }


def cpu_fallback_warning(cfg: Any, names: Iterable[str], status: Optional[dict] = None) -> Optional[str]:
    """The one line to warn with when components of `names` with `device: auto` load real weights (not tiny) and no
    usable GPU is here, so they would run on the CPU (None when a GPU is usable or nothing real is on auto)."""
    real = [n for n in names if runs_real_size_on_auto(cfg.components[n])]
    if not real:
        return None
    status = status or gpu_status()
    if status["available"]:
        return None
    listed = ", ".join(f"components.{n} ({cfg.components[n].pretrained})" for n in real)
    return (
        f"{listed} have device: auto and no usable GPU is here ({status['reason']}): they run on the CPU, where a "
        f"real-size model takes hours per thousand questions; run on a GPU node, or set their device: cpu (or "
        f"preset=cpu) to mean it"
    )


SMALL_WEIGHTS_BYTES = 200 << 20  # local weights below this run on a CPU in reasonable time (tiny models saved to disk)
# the weights judged in this process, once each: warned about (at an evaluation's start-up, or when first built), or
# found small; a later build of the same weights says nothing and walks no folder again
_JUDGED_ON_CPU: set[str] = set()


def runs_real_size_on_auto(spec: Any) -> bool:
    """Whether a component (its spec or config section) would run a real-size model wherever `device: auto` puts it:
    real weights (not tiny), device auto, and not a small local file or folder (a tiny model saved to disk)."""
    return (
        not spec.tiny
        and str(spec.device or "auto") == "auto"
        and bool(spec.pretrained)
        and not _small_local_weights(str(spec.pretrained))
    )


def _small_local_weights(pretrained: str) -> bool:
    """Whether `pretrained` is a local file or folder whose weight files add up to less than SMALL_WEIGHTS_BYTES."""
    path = os.path.expanduser(pretrained)
    if os.path.isfile(path):
        return os.path.getsize(path) < SMALL_WEIGHTS_BYTES
    if not os.path.isdir(path):
        return False  # a hub id: a released, real-size model
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(WEIGHT_FILE_SUFFIXES))
        if total >= SMALL_WEIGHTS_BYTES:
            return False
    return True


def warn_cpu_fallback(cfg: Any, names: Iterable[str]) -> Optional[str]:
    """Log `cpu_fallback_warning` once, at start-up (evaluation; training refuses a missing GPU in check_hardware)."""
    names = list(names)
    line = cpu_fallback_warning(cfg, names)
    if line:
        log.warning(line)
        _JUDGED_ON_CPU.update(str(cfg.components[n].pretrained) for n in names if cfg.components[n].pretrained)
    return line


def warn_auto_on_cpu(spec: Any) -> Optional[str]:
    """The warning of a real model whose `device: auto` found no usable GPU, when it is built (embed, retrieve,
    summarize, rerank, mine, cache-vit: every command that loads one); once per weights and process."""
    if spec.tiny or not spec.pretrained or str(spec.device or "auto") != "auto":
        return None
    key = str(spec.pretrained)
    if key in _JUDGED_ON_CPU:
        return None
    _JUDGED_ON_CPU.add(key)
    if _small_local_weights(key):
        return None
    line = (
        f"component {spec.kind!r} ({spec.pretrained}) has device: auto and no usable GPU is here "
        f"({gpu_status()['reason']}): it runs on the CPU, where a real-size model takes hours per thousand items; "
        f"run on a GPU node, or set its device: cpu (or preset=cpu) to mean it"
    )
    log.warning(line)
    return line
