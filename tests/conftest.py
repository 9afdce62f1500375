"""Shared pytest fixtures: the devices and buffer backends every exactness test runs on, and a toy
English-German corpus with a tiny-model revnmt-train runner.

Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors (slow, exact): the
variable must be set before the kernels are first imported, which happens lazily on first use.
"""

import importlib.util
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1":
    import interpreter_calls

    interpreter_calls.install()

# Under pytest-xdist each worker gets its share of the cores, it and the revnmt processes it starts (they inherit
# OMP_NUM_THREADS): N workers each running torch on every core oversubscribe the CPU, and OpenMP's threads then wait
# on each other's barriers for far longer than the work takes. A test that needs a thread count sets its own.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

_NO_CUDA = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
_NO_TRITON = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e .[dev])")

DEVICES = ["cpu", pytest.param("cuda", marks=_NO_CUDA)]

#: (device, backend) pairs that run everywhere fast: every test over the buffer runs on them.
FAST_BACKENDS = [
    pytest.param(("cpu", "numba"), id="cpu-numba"),
    pytest.param(("cpu", "torch"), id="cpu-torch"),
    pytest.param(("cuda", "torch"), id="cuda-torch", marks=_NO_CUDA),
    pytest.param(("cuda", "triton"), id="cuda-triton", marks=[_NO_CUDA, _NO_TRITON]),
]
#: The Triton kernels in the interpreter (about 20 ms a launch): for tests of a few dozen launches.
INTERPRETED_TRITON = pytest.param(("cpu", "triton"), id="cpu-triton-interpreted",
                                  marks=[_NO_TRITON, pytest.mark.skipif(HAS_CUDA, reason="CUDA runs the real kernels")])
ALL_BACKENDS = FAST_BACKENDS + [INTERPRETED_TRITON]


def assert_same_words(a, b) -> None:
    """Two information buffers hold the same words bit for bit: live words, each tile's stack up to its height
    (the slots above are scratch), heights, flags, error code and pushes."""
    a.check()
    b.check()
    wa, wb = a.words, b.words
    heights = a.heights()
    assert heights == b.heights() and a.pushes == b.pushes
    assert torch.equal(wa.curr.cpu(), wb.curr.cpu())
    for tile, height in enumerate(heights):
        rows = slice(tile * wa.tile_rows, (tile + 1) * wa.tile_rows)
        assert torch.equal(wa.stack[:height, rows].cpu(), wb.stack[:height, rows].cpu()), f"tile {tile}"
    assert torch.equal(wa.overflows().cpu(), wb.overflows().cpu())


def compile_for_the_gpu(script: str, arch: int, timeout: int) -> str:
    """Run a compile ``script`` (it imports tests/ptxas_log.py) for ``arch`` in a process of its own, where
    ``TRITON_INTERPRET`` is unset (the kernels are decorated for one mode at import), and return what it printed
    (registers and spills per kernel variant; pytest -rP shows them). Fails the test if the script fails."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]  # where the revnmt and buffers packages are
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), str(root / "tests"), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", script, str(arch)], capture_output=True, text=True, env=env,
                            timeout=timeout)
    print(result.stdout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """CPU always; CUDA where a GPU is present (skipped cleanly elsewhere)."""
    return torch.device(request.param)


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
    """Run revnmt-train in-process with a tiny model on the toy corpus; returns the exit status."""

    def run(save_dir: Path, *options: str, train_prefix: str | None = None) -> int:
        # a fixed batch unless the memory budget is to choose it
        batch = [] if "--memory-budget" in options else ["--batch-size", "32"]
        from revnmt.cli.train import main  # imported late: TRITON_INTERPRET is set above first

        return main(["--train", train_prefix or toy["train"], "--valid", toy["valid"], "--save-dir", str(save_dir),
                     *TINY_MODEL, *batch, *options])

    return run


def device_node(folder: Path, name: str) -> str:
    """/dev/null or /dev/full for a test that writes to it; as root a node of the same device made in ``folder``,
    so that a bug that replaced it with a regular file would not break the machine's."""
    if os.geteuid() != 0:
        return f"/dev/{name}"  # nobody but root can replace it
    node = folder / name
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, {"null": 3, "full": 7}[name]))
    return str(node)


def read_curves(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve of ``--tensorboard`` in ``folder``'s event files, as TensorBoard shows it (the points a
    resumed run purged left out): (step, value) in order."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0})  # 0: every point, none sampled away
    events.Reload()
    return {tag: [(point.step, point.value) for point in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def curve_steps(curve: list[tuple[int, float]]) -> list[int]:
    return [step for step, _ in curve]
