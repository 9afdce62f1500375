"""benchmarks/buffer_tiles.py: what it reads off a sweep's buffer adds up, and smaller tiles stack no higher."""

from benchmark_scripts import load_script

tiles = load_script("buffer_tiles")


def test_a_record_reads_the_buffer_at_its_fullest():
    small, whole = (tiles.measure("revgru", 6, 8, 16, tile) for tile in (2, 6))
    assert whole["tile"] == 6 and small["tile"] == 2 and small["lanes"] == whole["lanes"] == 16
    for record in (small, whole):
        assert 0 < record["words_in_use"] <= record["allocated_words"]
        assert record["proven_height"] >= record["max_height"] >= record["mean_height"] > 0  # the bound holds
        assert record["room"] >= record["max_height"] and record["reruns"] == 0  # the first sweep taught the room
        assert record["allocated_words"] == (record["room"] + 2) * 6 * 16  # the room, the spare level, live words
    assert whole["words_in_use"] == (whole["max_height"] + 1) * 6 * 16  # one tile: all its lanes at its height
    assert 3 * whole["flag_bytes"] - 2 <= small["flag_bytes"] <= 3 * whole["flag_bytes"]  # a bit a push and tile
    assert small["max_height"] <= whole["max_height"]  # a tile of two is never higher than the six around it
