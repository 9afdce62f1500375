"""Tests of revnmt.training.save_dir: one holder of a save directory at a time, no stale lock."""

import pytest

from revnmt.training.save_dir import LOCK_FILE, SaveDirInUse, locked_save_dir


def test_a_held_save_dir_is_refused_naming_the_holder_and_free_again_after(tmp_path):
    run = tmp_path / "a" / "run"
    with locked_save_dir(run):
        assert run.is_dir()
        pid = (run / LOCK_FILE).read_text().strip()
        # flock is per open file: a second opening conflicts even in the same process
        with pytest.raises(SaveDirInUse, match=f"in use by another revnmt-train run \\(PID {pid}\\)"):
            with locked_save_dir(run):
                pass
        assert (run / LOCK_FILE).read_text().strip() == pid  # the failed attempt kept the holder's PID
    with locked_save_dir(run):  # released on leaving, though the file stays
        pass


def test_a_save_dir_that_cannot_be_made_is_an_os_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError), locked_save_dir(tmp_path / "file" / "run"):
        pass
