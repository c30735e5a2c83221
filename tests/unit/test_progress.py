"""Progress lines for files: the mode chosen from config, environment and terminal; when lines come; what they say."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from qkvqa.config.schema import PROGRESS_MODES
from qkvqa.errors import ConfigError
from qkvqa.utils import progress as P
from qkvqa.utils.progress import ProgressLines, format_seconds, progress, progress_mode, progress_settings


def fake_clock(monkeypatch, start: float = 0.0) -> list[float]:
    """The progress module's clock, set by the test (only that module's: the real `time` of other threads stays)."""
    clock = [start]
    monkeypatch.setattr(P, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    return clock


def lines_of(**kwargs) -> tuple[ProgressLines, list[str]]:
    out: list[str] = []
    return ProgressLines(emit=out.append, **kwargs), out


def test_schema_and_helper_name_the_same_modes():
    assert PROGRESS_MODES == P.MODES


def test_mode_follows_config_then_environment_then_the_terminal(monkeypatch, capsys):
    monkeypatch.delenv("QKVQA_PROGRESS", raising=False)
    assert progress_mode() == "lines"  # pytest captures stdout/stderr: not terminals
    monkeypatch.setenv("QKVQA_PROGRESS", "0")
    assert progress_mode() == "off"
    monkeypatch.setenv("QKVQA_PROGRESS", "bar")
    assert progress_mode() == "bar"
    with progress_settings(mode="lines"):  # logger.progress.mode wins over the environment
        assert progress_mode() == "lines"
    assert progress_mode() == "bar"  # and is restored after the job
    monkeypatch.setenv("QKVQA_PROGRESS", "sometimes")
    with pytest.raises(ConfigError, match="QKVQA_PROGRESS='sometimes' is not one of auto, bar, lines, off"):
        progress_mode()


def test_progress_gives_lines_in_lines_mode_and_nothing_off_rank_zero(monkeypatch):
    monkeypatch.setenv("QKVQA_PROGRESS", "lines")
    assert isinstance(progress(range(3), desc="x"), ProgressLines)
    monkeypatch.setenv("RANK", "1")
    assert not isinstance(progress(range(3), desc="x"), ProgressLines)


def test_a_line_at_each_tenth_once_a_second_has_passed_and_one_at_the_end(monkeypatch):
    clock = fake_clock(monkeypatch, 100.0)
    bar, out = lines_of(desc="mine val", total=50, unit="question", every_s=30.0, every_fraction=0.1)
    for _ in range(50):
        clock[0] += 0.5  # 2 questions a second
        bar.update(1)
    bar.close()
    # 10% = 5 questions = 2.5 s: every mark is at least a second after the last line
    assert [re.search(r"(\d+)/50", line).group(1) for line in out] == [str(5 * k) for k in range(1, 11)]
    assert out[0] == "mine val: 5/50 question (10%) | 2 question/s | 0:00:02 elapsed | ETA 0:00:22"
    assert out[-1].endswith("ETA 0:00:00")


def test_a_fast_loop_prints_only_its_end_line(monkeypatch):
    fake_clock(monkeypatch)  # no time passes: a stall of the machine cannot add a line
    out: list[str] = []
    for _ in ProgressLines(
        range(1000), desc="check", unit="question", every_s=30.0, every_fraction=0.1, emit=out.append
    ):
        pass
    assert len(out) == 1 and out[0].startswith("check: 1,000/1,000 question (100%)") and out[0].endswith("| done")


def test_time_lines_without_a_total_say_the_eta_is_unknown(monkeypatch):
    clock = fake_clock(monkeypatch, 0.0)
    bar, out = lines_of(desc="kb build", unit="B", unit_scale=True, every_s=30.0)
    for _ in range(4):
        clock[0] += 20.0
        bar.update(5_000_000)
    assert out == [
        "kb build: 10M B | 250k B/s | 0:00:40 elapsed | ETA ?",
        "kb build: 20M B | 250k B/s | 0:01:20 elapsed | ETA ?",
    ]


def test_fields_and_postfix_are_shown_and_a_resumed_loop_rates_only_its_own_steps(monkeypatch):
    clock = fake_clock(monkeypatch, 0.0)
    bar, out = lines_of(
        desc="train",
        total=200,
        unit="steps",
        initial=100,
        every_fraction=0.0,
        every_s=10.0,
        fields=lambda: ["epoch 3", "loss 0.5000"],
    )
    bar.set_postfix(failed=0)
    clock[0] = 10.0
    bar.advance_to(150)  # 50 steps in 10 s since this launch started at step 100
    assert out == [
        "train: 150/200 steps (75%) | 5 steps/s | epoch 3 | loss 0.5000 | failed=0 | 0:00:10 elapsed | ETA 0:00:10"
    ]


def test_format_seconds():
    assert format_seconds(3725.4) == "1:02:05" and format_seconds(-1) == "0:00:00"


def test_a_loop_of_half_a_second_prints_one_line(monkeypatch):
    clock = fake_clock(monkeypatch)  # 0.1 s a step, whatever the load (a real sleep could pass 1 s)
    out: list[str] = []
    for _ in ProgressLines(range(5), emit=out.append, every_s=30.0):
        clock[0] += 0.1
    assert len(out) == 1 and "5/5 it (100%)" in out[0]
