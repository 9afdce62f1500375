"""revnmt.training.distributed's own parts; the torchrun jobs themselves are in test_parallel.py."""

import threading
import time
from pathlib import Path

import pytest

from revnmt.training import distributed
from revnmt.training.distributed import _threads, _wait_for_threads_to_end

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc/self/task")


def _thread_that_runs_for(seconds: float) -> tuple[threading.Thread, set[str]]:
    before = _threads()
    started = threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), time.sleep(seconds)))
    thread.start()
    started.wait()
    return thread, _threads() - before


def test_a_rank_leaves_once_its_groups_threads_have_ended():
    thread, new = _thread_that_runs_for(0.3)
    assert new  # the native thread is seen
    _wait_for_threads_to_end(new)
    assert not thread.is_alive() and not new & _threads()


def test_a_thread_that_never_ends_holds_the_rank_no_longer_than_the_limit(monkeypatch):
    monkeypatch.setattr(distributed, "GROUP_THREADS_END_S", 0.2)
    thread, new = _thread_that_runs_for(3)
    started = time.monotonic()
    _wait_for_threads_to_end(new)
    assert 0.2 <= time.monotonic() - started < 2 and thread.is_alive()
    thread.join()
