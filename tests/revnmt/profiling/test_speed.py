"""Models timed side by side: the calls take turns, and the warm-up is not timed."""

import pytest

from revnmt.profiling.speed import interleaved_seconds, tokens_per_second


def test_calls_take_turns_round_by_round_and_the_warmup_is_not_timed():
    calls = []
    seconds = interleaved_seconds({name: lambda i, name=name: calls.append((name, i)) for name in ("a", "b")},
                                  rounds=3, warmup=1)
    assert calls == [(name, i) for i in range(4) for name in ("a", "b")]
    assert {name: len(spent) for name, spent in seconds.items()} == {"a": 3, "b": 3}
    assert all(s >= 0 for spent in seconds.values() for s in spent)


def test_tokens_per_second_needs_batches_after_the_warmup():
    with pytest.raises(ValueError, match="more than 2 batches"):
        tokens_per_second({"a": lambda batch: None}, [object(), object()], warmup=2)
