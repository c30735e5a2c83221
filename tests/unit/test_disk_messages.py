"""Issue 44 class 5: on a full disk, `embed` and `evaluate` named the working directory ("`.`: 65.0 GiB free"): a write
through a file object (np.save, the predictions' JSONL) raises an OSError without a file name. The writers now name
the file they were writing, so the one line names the full disk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from qkvqa.utils.io import append_jsonl, atomic_write, disk_error_message


def test_a_full_disk_under_np_save_names_the_file_not_the_working_directory(tmp_path):
    def full(f):
        np.save(f, np.zeros(3))
        raise OSError(errno.ENOSPC, "No space left on device")  # as a file object's write reports it: no file name

    target = tmp_path / "embeddings" / "shard-00000.npy"
    with pytest.raises(OSError) as caught:
        atomic_write(target, full)
    assert caught.value.filename == str(target)
    line = disk_error_message(caught.value)
    assert line.startswith(f"{target}: No space left on device;") and " free there" in line
    assert not line.startswith(".:") and list(target.parent.iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_under_an_appended_jsonl_names_the_file():
    with pytest.raises(OSError) as caught:
        append_jsonl("/dev/full", [{"answer": "x" * 100}])
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/dev/full"
    assert disk_error_message(caught.value).startswith("/dev/full: ")
    assert os.getcwd() not in disk_error_message(caught.value).split(";")[0]
