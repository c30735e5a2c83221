"""Configs: the dataclass schema, the base -> presets -> experiment -> overrides composition."""
