"""A toy English-German corpus written into a temporary folder, and a tiny-model train.py runner."""

import random
from pathlib import Path

import pytest

from revnmt.cli.train import main

LEXICON = {"a": "ein", "the": "der", "man": "mann", "dog": "hund", "cat": "katze", "runs": "läuft",
           "sleeps": "schläft", "in": "in", "on": "auf", "park": "park", "street": "straße", "big": "großer",
           "small": "kleiner", "red": "roter", "today": "heute", "and": "und"}
TINY_MODEL = ["--emb-dim", "16", "--hidden-size", "16", "--slice-dim", "4", "--buffer-lanes", "4",
              "--min-freq", "1", "--log-every", "2", "--device", "cpu"]


def write_toy_corpus(folder: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, str]:
    """Word-by-word translated sentences of 2-9 words; returns the file prefix of each split."""
    rng = random.Random(seed)
    prefixes = {}
    for split, size in sizes.items():
        words = [rng.choices(list(LEXICON), k=rng.randint(2, 9)) for _ in range(size)]
        (folder / f"{split}.en").write_text("".join(" ".join(s).capitalize() + " .\n" for s in words))
        (folder / f"{split}.de").write_text("".join(" ".join(LEXICON[w] for w in s).capitalize() + " .\n"
                                                    for s in words))
        prefixes[split] = str(folder / split)
    return prefixes


@pytest.fixture
def toy(tmp_path: Path) -> dict[str, str]:
    return write_toy_corpus(tmp_path, {"train": 200, "valid": 20, "test": 10})


@pytest.fixture
def train(toy: dict[str, str]):
    """Run train.py in-process with a tiny model on the toy corpus; returns the exit status."""

    def run(save_dir: Path, *options: str, train_prefix: str | None = None) -> int:
        # a fixed batch unless the memory budget is to choose it
        batch = [] if "--memory-budget" in options else ["--batch-size", "32"]
        return main(["--train", train_prefix or toy["train"], "--valid", toy["valid"], "--save-dir", str(save_dir),
                     *TINY_MODEL, *batch, *options])

    return run
