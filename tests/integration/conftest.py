"""Fixtures of the integration tests: the synthetic world with a stage-1 index built by tiny encoders."""

from __future__ import annotations

import pytest

from tests.helpers.eval_env import REPO, build_eval_env, tiny  # noqa: F401  (REPO, tiny: for the tests)


@pytest.fixture(scope="session")
def eval_env(world, tmp_path_factory):
    """experiments/ with `world_eval.yaml` (tiny components on the synthetic world) and a built stage-1 index."""
    return build_eval_env(tmp_path_factory.mktemp("evaluate"), world)
