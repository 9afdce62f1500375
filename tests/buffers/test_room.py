import math

from buffers import StackRoom
from buffers.room import MARGIN, SPARE_LEVELS


def test_a_room_that_learned_nothing_is_the_spare_levels():
    assert StackRoom().levels(pushes=1_000, proven=300) == SPARE_LEVELS
    assert StackRoom(spare=0).levels(pushes=1_000, proven=300) == 0


def test_the_room_follows_the_highest_rate_seen_with_a_margin_and_never_passes_the_proven_bound():
    room = StackRoom()
    room.record(height=10, pushes=200, rerun=True)
    room.record(height=3, pushes=200, rerun=False)  # a lower rate does not shrink the room: a rerun costs a sweep
    assert room.levels_per_push == 0.05 and (room.sweeps, room.reruns) == (2, 1)
    assert room.levels(pushes=400, proven=1_000) == math.ceil(0.05 * 400 * MARGIN) + SPARE_LEVELS
    assert room.levels(pushes=400, proven=12) == 12  # no sweep of 400 pushes can stand higher
    assert StackRoom(0.05, margin=1.0, spare=0).levels(pushes=400, proven=1_000) == 20


def test_a_sweep_without_pushes_teaches_nothing():
    room = StackRoom()
    room.record(height=0, pushes=0, rerun=False)
    assert room.levels_per_push == 0 and room.sweeps == 1
