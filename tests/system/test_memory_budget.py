"""train.py --memory-budget holds where a user feels it: the training process's peak resident memory."""

import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MiB = 2 ** 20

# Runs train.py in this process and prints its peak RSS at the end: the whole run (planning, training,
# validation, the test set) is what a memory limit sees.
_TRAIN_AND_REPORT = textwrap.dedent("""
    import sys
    from revnmt.cli.train import main
    status = main(sys.argv[1:])
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print("peak", int(hwm.split()[1]) * 1024, flush=True)
    sys.exit(status)
""")


def _write_corpus(folder: Path) -> dict[str, str]:
    """Random sentences over a 1,500-word vocabulary, up to 40 words: enough for the smaller budget to bind."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(1500)]
    prefixes = {}
    for split, size in {"train": 3000, "valid": 30, "test": 20}.items():
        lines = [rng.choices(words, k=rng.randint(3, 40)) for _ in range(size)]
        (folder / f"{split}.en").write_text("".join(" ".join(s) + "\n" for s in lines))
        (folder / f"{split}.de").write_text("".join(" ".join(reversed(s)) + "\n" for s in lines))
        prefixes[split] = str(folder / split)
    return prefixes


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc to read the peak RSS")
@pytest.mark.parametrize("rnn", ["revgru", "gru"])
def test_training_stays_within_two_budgets(rnn, tmp_path):
    corpus = _write_corpus(tmp_path)
    options = ["--train", corpus["train"], "--valid", corpus["valid"], "--test", corpus["test"], "--min-freq", "1",
               "--emb-dim", "128", "--hidden-size", "256", "--rnn", rnn, "--max-steps", "3", "--log-every", "1",
               "--valid-beam", "1", "--test-beam", "2", "--device", "cpu"]
    if rnn == "gru":
        options += ["--attention", "hidden"]
    plans = []
    # Both budgets bind below the whole corpus a batch: a larger one plans all 3,000 pairs into one batch, whose steps
    # are the slowest of the suite and test nothing more.
    for budget in (800, 900):
        run = subprocess.run([sys.executable, "-c", _TRAIN_AND_REPORT, *options, "--memory-budget", f"{budget}MiB",
                              "--save-dir", str(tmp_path / f"run-{budget}")],
                             cwd=REPO, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        peak = int(re.search(r"^peak (\d+)$", run.stdout, re.M).group(1))
        assert peak <= budget * MiB, f"peak RSS {peak / MiB:.0f} MiB over the {budget} MiB budget"
        plans.append(int(re.search(r"batches of up to (\d+) tokens", run.stderr).group(1)))
        assert re.search(r"peak RSS [\d.]+ [KMG]iB of [\d.]+ [KMG]iB budget", run.stderr)  # beside the budget
    small, large = plans
    assert small < large <= 3000 * 41  # the smaller budget binds, and the larger allows larger batches
