"""Issue 45 item 2 (the part done): no key of the `qff:` section is silently dropped. Every field of `QFFConfig` is read
by some code (`qff.<key>` or `cfg.qff.<key>`, a `"qff.<key>"` string, or one of the declared routes: the component's
`RUNTIME_DEFAULTS`, the trainer's `QFFTrainSettings.from_config`, a scorer's `QFF_KEYS`); a field added to the schema
and read nowhere fails here, naming it. The component and the trainer score through the one `scorer_from_qff`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

from qkvqa.config.schema import QFFConfig
from qkvqa.models.qff_module import QFFTrainSettings
from qkvqa.qff.builder import RUNTIME_DEFAULTS
from qkvqa.qff.scorers import SCORERS

REPO = Path(__file__).resolve().parents[2]


def keys_read_in_code() -> set[str]:
    """Every `<...>.qff.NAME` / `qff.NAME` attribute (or through a name bound to `<...>.qff`), `qff["NAME"]` subscript
    and `"qff.NAME..."` string in the code."""
    read: set[str] = set()
    for path in [*(REPO / "src" / "qkvqa").rglob("*.py"), *(REPO / "data_modules").rglob("*.py")]:
        if "data_modules" in path.parts[len(REPO.parts) + 1 :] and path.is_symlink():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {"qff"}  # and every name bound to `<...>.qff` (`q = cfg.qff`)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "qff":
                aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            inner = node.value if isinstance(node, (ast.Attribute, ast.Subscript)) else None
            names_qff = (isinstance(inner, ast.Name) and inner.id in aliases) or (
                isinstance(inner, ast.Attribute) and inner.attr == "qff"
            )
            if isinstance(node, ast.Attribute) and names_qff:
                read.add(node.attr)
            elif isinstance(node, ast.Subscript) and names_qff and isinstance(node.slice, ast.Constant):
                read.add(str(node.slice.value))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("qff."):
                read.add(node.value.split(".")[1])
    return read


def test_every_key_of_the_qff_section_has_a_reader():
    from_config = inspect.getsource(QFFTrainSettings.from_config)
    routes = set(RUNTIME_DEFAULTS) | {key for cls in SCORERS.values() for key in cls.QFF_KEYS.values()}
    routes |= {f.name for f in dataclasses.fields(QFFConfig) if f"qff.{f.name}" in from_config}
    unread = sorted({f.name for f in dataclasses.fields(QFFConfig)} - keys_read_in_code() - routes)
    assert unread == [], f"qff keys in the schema that no code reads (silently dropped): {unread}"


def test_the_scan_would_catch_a_dropped_key():
    """The check above is not vacuous: a name no code uses is reported."""
    assert "no_such_qff_key" not in keys_read_in_code()
    assert {"alpha", "scorer", "lr", "negatives"} <= keys_read_in_code() | set(RUNTIME_DEFAULTS)
