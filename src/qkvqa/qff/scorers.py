"""The QFF section scorer as an extension point: `SectionScorer`, its typed options, the built-ins and `qff.scorer`.

A scorer turns the question's query tokens `[..., A, D]` and a section's `[..., B, D]` into one score per pair
(`[...]`, leading dimensions broadcast). Training (the contrastive logits), the validation rerank, `qkvqa rerank`
and `qkvqa evaluate` all score through the one instance `scorer_from_qff(cfg.qff)` builds, so a scorer named in
config is the scorer everywhere. `qff.scorer` names a registered scorer (`SCORERS`) or a class in the user's own
code, `module.path:ClassName`; its options come from `qff.scorer_options` (the built-in late interaction also reads
`qff.score_direction` and `qff.question_norm`), checked against the class's declared `OPTIONS` when the config is
composed. `record()` is what the trained weights, the rerank sidecar and the card carry (docs/extending.md).
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from qkvqa.components.plugins import Option, check_options, plugin_record, register_plugin, resolve_plugin
from qkvqa.config.schema import QUESTION_NORMS, SCORE_DIRECTIONS  # declared with the config
from qkvqa.errors import ConfigError

__all__ = ["Option", "SectionScorer", "LateInteraction", "register_scorer", "scorer_from_qff", "scorer_spec"]
POINT = "qff.scorer"


class SectionScorer:
    """The scorer interface: `score(question_tokens, section_tokens, training=False) -> scores`.

    Subclasses declare `OPTIONS` (name -> `Option`); `__init__` receives them checked and complete as `self.options`.
    `training=True` is the contrastive loss's call (the validation section R@1 included); inference (rerank,
    evaluate, the validation article R@1) calls with `training=False`. A scorer holds no trainable parameters."""

    OPTIONS: ClassVar[dict[str, Option]] = {}
    # option -> the `qff.<key>` it is read from besides qff.scorer_options (the built-in's historical keys)
    QFF_KEYS: ClassVar[dict[str, str]] = {}

    def __init__(self, **options: Any):
        self.options = check_options("qff.scorer_options", self.OPTIONS, options, scorer_name(type(self)))

    def score(self, question_tokens, section_tokens, training: bool = False):
        """`[..., A, D]` question tokens against `[..., B, D]` section tokens -> `[...]` scores."""
        raise NotImplementedError(f"{type(self).__name__}.score")

    def record(self) -> dict:
        """What the trained QFF, the rerank results and the card record of this scorer (compared on load)."""
        return {
            "scorer": scorer_name(type(self)),
            "scorer_options": dict(sorted(self.options.items())),
            **source(type(self)),
        }


class LateInteraction(SectionScorer):
    """ColBERT-style late interaction (the paper's): `qkvqa.qff.scoring.late_interaction` with these options.

    The training loss normalises each question token (per_token) whatever `question_norm` says, as OMGM trains."""

    OPTIONS = {
        "score_direction": Option(str, "question_to_section", choices=SCORE_DIRECTIONS, doc="max over which side"),
        "question_norm": Option(
            str, "per_token", choices=QUESTION_NORMS, doc="inference's question normalisation", runtime=True
        ),
    }
    QFF_KEYS = {"score_direction": "score_direction", "question_norm": "question_norm"}

    def score(self, question_tokens, section_tokens, training: bool = False):
        from qkvqa.qff.scoring import late_interaction

        norm = "per_token" if training else self.options["question_norm"]
        return late_interaction(question_tokens, section_tokens, self.options["score_direction"], norm)


SCORERS: dict[str, type[SectionScorer]] = {}
DEFAULT_SCORER = "late_interaction"


def register_scorer(name: str):
    """Class decorator: make a SectionScorer subclass selectable as `qff.scorer: name`."""

    def wrap(cls: type[SectionScorer]) -> type[SectionScorer]:
        if not (isinstance(cls, type) and issubclass(cls, SectionScorer)):
            raise TypeError(f"register_scorer({name!r}): {cls!r} is not a SectionScorer subclass")
        register_plugin(POINT, name, cls)
        SCORERS[name] = cls
        return cls

    return wrap


register_scorer(DEFAULT_SCORER)(LateInteraction)


def scorer_name(cls: type) -> str:
    """The registered name of a scorer class, else its import path `module:ClassName`."""
    for name, known in SCORERS.items():
        if known is cls:
            return name
    return f"{cls.__module__}:{cls.__qualname__}"


def source(cls: type) -> dict:
    """For a plugin scorer (not shipped in qkvqa): its source file's sha256 (`scorer_source_sha256`); {} otherwise."""
    record = plugin_record(cls)
    return {"scorer_source_sha256": record["source_sha256"]} if record else {}


def runtime_options(cls: type[SectionScorer]) -> list[str]:
    """The options of `cls` that change inference only (`Option.runtime`): a trained QFF may use another value."""
    return sorted(key for key, opt in cls.OPTIONS.items() if opt.runtime)


def resolve_scorer(name: str) -> type[SectionScorer]:
    """The SectionScorer class `qff.scorer` names: a registered name or `module.path:ClassName`; else ConfigError."""
    return resolve_plugin(POINT, name, SectionScorer)


def _get(qff: Any, key: str, default: Any = None) -> Any:
    if isinstance(qff, Mapping):
        return qff.get(key, default)
    return getattr(qff, key, default)


def scorer_spec(qff: Any) -> tuple[type[SectionScorer], dict]:
    """(class, checked options) of the scorer a `qff:` section (QFFConfig, DictConfig or mapping) selects."""
    name = _get(qff, "scorer", DEFAULT_SCORER) or DEFAULT_SCORER
    cls = resolve_scorer(name)
    given = dict(_get(qff, "scorer_options", None) or {})
    for other in SCORERS.values():  # another scorer's qff.<key> set while this one does not read it: not silent
        for option, key in other.QFF_KEYS.items():
            value, default = _get(qff, key), other.OPTIONS[option].default
            if key not in cls.QFF_KEYS.values() and value is not None and value != default:
                raise ConfigError(
                    f"qff.{key}={value!r} is an option of the {scorer_name(other)} scorer, which qff.scorer={name} "
                    f"does not read: leave it at {default!r} (or set qff.scorer={scorer_name(other)})"
                )
    for option, key in cls.QFF_KEYS.items():
        value = _get(qff, key)
        if value is not None:
            if option in given and given[option] != value:
                raise ConfigError(
                    f"qff.scorer_options.{option}={given[option]!r} but qff.{key}={value!r}: set one of them"
                )
            given[option] = value
    return cls, check_options("qff.scorer_options", cls.OPTIONS, given, scorer_name(cls))


def scorer_from_qff(qff: Any) -> SectionScorer:
    """The one SectionScorer instance training, rerank and evaluate score with (the `qff:` section's)."""
    cls, options = scorer_spec(qff)
    return cls(**options)


def check_qff_plugins(qff: Any) -> None:
    """Refuse, when the config is composed, an unknown `qff.scorer`, a bad `qff.scorer_options` entry, or a
    `qff.focus` import path that names no focus class (`qkvqa.config.schema.PLUGIN_CHECKS`)."""
    scorer_spec(qff)
    focus = _get(qff, "focus")
    if isinstance(focus, str) and ":" in focus:
        from qkvqa.qff.model import resolve_focus

        resolve_focus(focus)
