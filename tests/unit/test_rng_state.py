"""Issue 37 item 2: each rank's generator states are its own, and on CUDA each process restores its own device's."""

from __future__ import annotations

import logging

import pytest
import torch

from qkvqa.callbacks.run_state import cuda_state_for, rng_for_rank, rng_state, set_rng_state


def test_a_rank_takes_its_own_entry_and_falls_back_to_rank_zero_in_one_line(caplog):
    states = [{"torch": torch.tensor([r])} for r in range(3)]
    saved = {"rng": states[0], "rng_per_rank": states}
    assert [rng_for_rank(saved, r, 3) for r in range(3)] == states
    with caplog.at_level(logging.WARNING, logger="qkvqa.callbacks.run_state"):
        assert rng_for_rank({"rng": states[0]}, 1, 2) is states[0]  # an older checkpoint
        assert rng_for_rank(saved, 1, 2) is states[0]  # saved at another world size
    assert "rank 1 resumes with rank 0's random generator states: the checkpoint holds no per-rank" in caplog.text
    assert "the states of 3 ranks, not 2" in caplog.text
    assert rng_for_rank({"rng": states[0]}, 0, 1) is states[0]


def test_the_cuda_state_is_the_own_device_s_also_from_an_all_devices_list():
    own = torch.tensor([7], dtype=torch.uint8)
    assert cuda_state_for({"cuda": own, "cuda_device": 1}, 1) is own
    every = [torch.tensor([d], dtype=torch.uint8) for d in range(4)]  # get_rng_state_all() of an older run
    for local_rank in range(4):  # each process its own device's entry
        assert cuda_state_for({"cuda": every}, local_rank) is every[local_rank]
    assert cuda_state_for({"cuda": every}, 5) is None and cuda_state_for({}, 0) is None


def test_cpu_states_round_trip():
    torch.manual_seed(3)
    saved = rng_state()
    first = torch.rand(4)
    set_rng_state(saved)
    assert torch.equal(torch.rand(4), first)


@pytest.mark.gpu
def test_each_process_saves_and_restores_only_its_own_device():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    device = torch.cuda.current_device()
    saved = rng_state()
    assert saved["cuda_device"] == device and isinstance(saved["cuda"], torch.Tensor)
    first = torch.rand(4, device=f"cuda:{device}")
    set_rng_state(saved)
    assert torch.equal(torch.rand(4, device=f"cuda:{device}"), first)
