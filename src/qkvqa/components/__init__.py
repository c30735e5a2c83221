"""Model components: one registry that builds each from `{kind, pretrained | tiny, dtype, device}`."""

from qkvqa.components.registry import ComponentSpec, build_component, register_component, registered_kinds

__all__ = ["ComponentSpec", "build_component", "register_component", "registered_kinds"]
