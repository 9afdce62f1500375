"""benchmarks/launch_trace.py on tiny models: a record per (model, B, T) with the issue's keys, the grids that
LaunchCounter records, and a trace that does not run the Triton kernels equal to one that runs them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_script

from buffers.backends import triton_available
from revnmt.profiling.launches import Launch, LaunchCounter

pytestmark = [pytest.mark.skipif(not triton_available(), reason="triton is not installed (pip install -e .[dev])"),
              pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")]

REPO = Path(__file__).resolve().parents[2]
TINY = {"layers": 1, "emb_dim": 16, "hidden_size": 16, "slice_dim": 4, "src_vocab": 30, "tgt_vocab": 40}


@pytest.fixture(scope="module")
def launch_trace():
    """benchmarks/launch_trace.py as a module."""
    return load_script("launch_trace")


def test_small_run_writes_a_record_per_model_batch_and_length(tmp_path):
    out = tmp_path / "trace.json"
    sizes = [f"--{name.replace('_', '-')}={value}" for name, value in TINY.items()]
    command = [sys.executable, str(REPO / "benchmarks/launch_trace.py"), "--batch", "2", "40", "--lengths", "3", "5",
               "--rnn", "revgru", "revlstm", *sizes, "--json", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    records = json.loads(out.read_text())
    assert [(r["rnn"], r["length"], r["batch"]) for r in records] == [
        (rnn, length, batch) for rnn in ("revgru", "revlstm") for length in (3, 5) for batch in (2, 40)]
    for r in records:
        assert r["kernels"] == "traced" and r["model"] == TINY
        assert r["launches"] > r["triton_launches"] > 0
        assert r["launches_per_time_step"] == r["launches"] / r["length"]
        assert 1 <= r["min_programs"] <= r["max_programs"]
        assert [s["sweep"] for s in r["sweeps"]] == ["encoder forward", "decoder forward", "decoder reverse",
                                                     "encoder reverse"]
        # Nothing is read inside a sweep; the step reads the sweeps' checks twice, after the forward sweeps and after
        # the reverses, and nothing else.
        assert r["host_reads"] == 0 and all(s["host_reads"] == 0 for s in r["sweeps"])
        assert r["checks"] == r["host_reads_at_checks"] == r["host_reads_in_step"] == 2 and r["reruns"] == 0
        assert sum(g["launches"] for g in r["grids"]) == r["triton_launches"]
        # Both cells' sweeps run by the persistent kernels (revnmt.rnn.kernels.triton_sweeps).
        assert {g["kernel"] for g in r["grids"]} == {"_forward_kernel", "_reverse_kernel"}
    # The grids follow the batch, the number of launches the length.
    by_key = {(r["rnn"], r["length"], r["batch"]): r for r in records}
    for rnn in ("revgru", "revlstm"):
        assert by_key[rnn, 3, 40]["max_programs"] > by_key[rnn, 3, 2]["max_programs"]
        assert by_key[rnn, 5, 2]["triton_launches"] > by_key[rnn, 3, 2]["triton_launches"]
        assert by_key[rnn, 3, 40]["triton_launches"] == by_key[rnn, 3, 2]["triton_launches"]


@pytest.mark.parametrize("rnn", ["revgru", pytest.param("revlstm", marks=pytest.mark.slow)])
def test_a_trace_equals_a_run_of_the_kernels(launch_trace, rnn):
    # Every launch in order (the ATen ops, the Triton kernels with their grids) and every host read, the kernels
    # traced against run in the interpreter. Both steps pass the exactness guard: the run on its real states, the
    # trace on zeros. (At this size no forward sweep reads the buffer's height to size its stack, whose reads
    # follow the heights: see the benchmark's docstring.)
    model = launch_trace.traced_model(rnn, **TINY)
    launch_trace.trace_step(model, 2, 3)  # warm-up: the device's tables
    (traced, traced_reruns), (run, run_reruns) = (launch_trace.trace_step(model, 2, 3, run_kernels=run_kernels)
                                                  for run_kernels in (False, True))
    assert traced.launches == run.launches and traced.sections == run.sections
    assert traced_reruns == run_reruns
    assert any(launch.grid for launch in run.launches) and run.host_reads > 0


@pytest.mark.parametrize("rnn", ["revgru", pytest.param("revlstm", marks=pytest.mark.slow)])
def test_two_batches_of_one_shape_launch_the_same_kernels(launch_trace, rnn):
    # What a CUDA graph needs: the launches of a training step (every ATen op, every Triton kernel and its grid, every
    # host read, in order) follow the batch's shape, not its words. Run in the interpreter on two batches of other
    # words, after a step of that shape has taught the stacks their room.
    model = launch_trace.traced_model(rnn, **TINY)
    launch_trace.trace_step(model, 4, 5, run_kernels=True, seed=2)
    (first, first_reruns), (second, second_reruns) = (launch_trace.trace_step(model, 4, 5, run_kernels=True, seed=seed)
                                                      for seed in (0, 1))
    assert first.launches == second.launches and first.sections == second.sections
    assert sum(first_reruns.values()) == sum(second_reruns.values()) == 0


def test_the_counter_records_grids_and_does_not_run_kernels_when_told():
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)

    x = torch.zeros(10)
    with LaunchCounter() as run:
        add_one[(3,)](x, 10, BLOCK=4)
        add_one[lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]), 1)](x, 10, BLOCK=2)  # of the meta-parameters
        assert bool((x == 2).all())
        x[x > 1], x[[0, 1]]  # a mask's true elements are found on the host; a list of indices is not read
    assert run.launches[:2] == [Launch("add_one", (3,)), Launch("add_one", (5, 1))]
    assert [launch.programs for launch in run.launches[:2]] == [3, 5]
    assert [launch.name for launch in run.launches if launch.reads_host] == ["aten::_local_scalar_dense",
                                                                             "aten::index.Tensor"]
    assert run.host_reads == 2 and run.launches[-1] == Launch("aten::index.Tensor")

    with LaunchCounter(run_kernels=False) as traced:
        add_one[(3,)](x, 10, BLOCK=4)
        y = torch.empty(5)
    assert traced.launches == [Launch("add_one", (3,))]
    assert x.tolist() == [2.0] * 10 and y.tolist() == [0.0] * 5  # not run; the allocation zero-filled
