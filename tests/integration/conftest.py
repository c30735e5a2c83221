"""What the integration tests import from here (REPO, tiny); their `eval_env` fixture is in tests/conftest.py, shared
with the real tier so that one pytest worker builds the world's stage-1 index once."""

from __future__ import annotations

from tests.helpers.eval_env import REPO, tiny  # noqa: F401  (REPO, tiny: for the tests)
