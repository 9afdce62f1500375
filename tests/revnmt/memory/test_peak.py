"""revnmt.memory.peak: the collector's work set aside while a series of measurements runs."""

import gc
import weakref

import torch

from revnmt.memory.peak import measuring_many, release_free_memory

CPU = torch.device("cpu")


class _Node:
    """An object that can form a reference cycle, which only the cyclic collector frees."""

    def __init__(self) -> None:
        self.other = self


def test_what_lives_is_set_aside_while_measuring_and_given_back_after():
    assert gc.get_freeze_count() == 0
    with measuring_many():
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the modules, functions and tensors of the process
        with measuring_many():  # nested: the outer one keeps them aside
            pass
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0


def test_a_cycle_a_measured_step_leaves_is_still_collected():
    with measuring_many():
        cycle = _Node()
        gone = weakref.ref(cycle)
        del cycle
        release_free_memory(CPU)
        assert gone() is None


def test_a_cycle_that_lived_before_is_collected_once_measuring_ends():
    cycle = _Node()
    gone = weakref.ref(cycle)
    with measuring_many():
        del cycle
        release_free_memory(CPU)
        assert gone() is not None  # set aside: not scanned
    gc.collect()
    assert gone() is None
