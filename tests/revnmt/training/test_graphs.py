"""Tests of revnmt.training.graphs: the reversible step in two stretches, and its CUDA graphs against the eager step.

The graphs need a GPU (``scripts/gpu_check.sh`` runs the ``cuda`` tests here); on CPU the tests check what the graphs
rest on (each stretch launches the same for every batch of a shape, the step in two stretches, the check that tells a
replay it cannot go on), GraphedSteps' bookkeeping with CUDA's graph API stood in for, and the options' refusals."""

from __future__ import annotations

import contextlib

import pytest
import torch

from revnmt.arguments import run_config
from revnmt.checkpoints import Checkpoint
from revnmt.data.vocab import BOS, EOS, PAD
from revnmt.model import ExecutionConfig, ModelConfig, build_model
from revnmt.profiling.launches import LaunchCounter, check_lazily
from revnmt.rnn import ReversibleRNN, TensorInput
from revnmt.rnn.tape import Check, read, settle
from revnmt.training.config import TrainingConfig
from revnmt.training.graphs import GraphedSteps, training_step
from revnmt.training.schedule import build_optimizer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
VOCAB = 20


def _model(rnn: str = "revgru", device: str = "cpu", **execution):
    torch.manual_seed(0)
    config = ModelConfig(rnn=rnn, emb_dim=8, hidden_size=12, layers=2, dropout=0.3, attention="emb+slice",
                         slice_dim=3, encoder="bidirectional", src_vocab=VOCAB, tgt_vocab=VOCAB)
    return build_model(config, ExecutionConfig(**(dict(buffer_lanes=4) | execution))).to(device).train()


def _batch(batch: int, src_len: int, tgt_len: int, seed: int, device: str = "cpu"):
    """(src, src_len, tgt_in, tgt_out) of ``batch`` ragged sentences, the longest of the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (batch, src_len), generator=gen)
    tgt = torch.randint(4, VOCAB, (batch, tgt_len), generator=gen)
    src_lens = torch.randint(1, src_len + 1, (batch,), generator=gen)
    tgt_lens = torch.randint(1, tgt_len + 1, (batch,), generator=gen)
    src_lens[0], tgt_lens[0] = src_len, tgt_len
    for i in range(batch):
        src[i, src_lens[i]:] = PAD
        tgt[i, tgt_lens[i]:] = PAD
    tgt_in = torch.cat([torch.full((batch, 1), BOS), tgt], 1)
    tgt_out = torch.cat([tgt, torch.full((batch, 1), PAD)], 1)
    tgt_out[torch.arange(batch), tgt_lens] = EOS
    return tuple(t.to(device) for t in (src, src_lens, tgt_in, tgt_out))


def _tokens(batch) -> float:
    return float((batch[3] != PAD).sum())


# ---------------------------------------------------------------------------------------------------- on any device


def test_the_step_in_two_stretches_with_a_device_normalizer_is_train_step_bit_for_bit():
    # What a graph captures: the forward stretch, its checks read, the backward stretch, its guards read; the
    # normalizer a device scalar (a graph replays it with each batch's value), which on a CPU divides as the float.
    batch = _batch(5, 7, 6, seed=3)
    model = _model()
    torch.manual_seed(1)
    want = model.train_step(*batch, normalizer=_tokens(batch))
    want_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    masks = model.draw_masks(5, batch[0].device)
    step = model.reversal(batch[0], batch[2], batch[3], torch.tensor(_tokens(batch)), masks)
    checks = [check for tape in step.tapes for check in tape.pop_checks()]
    assert checks and not any(check.outgrown(v) for check, v in zip(checks, read(checks)))
    for check, values in zip(checks, read(checks)):
        check.conclude(values)
    step.backward()
    settle(*step.tapes)
    assert torch.equal(step.result.loss, want.loss) and step.result.held_bytes == want.held_bytes
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), want_grads))


@pytest.mark.parametrize("rnn, sweep_kernels", [
    ("revgru", "steps"), ("revgru", "persistent"),
    pytest.param("revlstm", "steps", marks=pytest.mark.slow),
    pytest.param("revlstm", "persistent", marks=pytest.mark.slow),
])
def test_what_a_graph_captures_is_the_same_for_every_batch_of_its_shape(rnn, sweep_kernels):
    # A CUDA graph replays its capture's kernels with their grids, scalars and tensor layouts: each stretch of the
    # step must launch exactly those for every batch of the captured shape, whatever its words, its lengths and so its
    # number of target tokens. Traced on the triton backend in the interpreter, the buffers checking lazily as on
    # CUDA, after a step of that shape taught the stacks their room.
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the interpreter's trace runs on CPU tensors; a GPU runs the graphs themselves (tests below)")
    model = _model(rnn, buffer_backend="triton", sweep_kernels=sweep_kernels)
    for rnn_stack in (m for m in model.modules() if isinstance(m, ReversibleRNN)):
        check_lazily(rnn_stack)
    # 8 sentences: one buffer tile, which the persistent kernels take. 5 source and 4 target tokens: each reverse
    # still ends on a partial chunk (the encoder's of 4 steps, the decoder's of 2 over 5 steps with BOS).
    warm_up = _batch(8, 5, 4, seed=9)
    model.train_step(*warm_up, normalizer=_tokens(warm_up))
    traces, tokens = [], []
    for seed in (0, 1):
        src, _, tgt_in, tgt_out = batch = _batch(8, 5, 4, seed=seed)
        tokens.append(_tokens(batch))
        normalizer, masks = torch.tensor(tokens[-1]), model.draw_masks(8, src.device)
        with LaunchCounter(arguments=True) as forward:
            step = model.reversal(src, tgt_in, tgt_out, normalizer, masks)
        checks = [check for tape in step.tapes for check in tape.pop_checks()]
        assert not any(check.outgrown(v) for check, v in zip(checks, read(checks)))
        with LaunchCounter(arguments=True) as backward:
            step.backward()
        settle(*step.tapes)
        traces.append((forward.launches, backward.launches))
        assert forward.host_reads == backward.host_reads == 0
    assert tokens[0] != tokens[1]
    assert traces[0] == traces[1]
    kernels = {launch.name for launch in traces[0][0] + traces[0][1] if launch.grid}
    assert ("_forward_kernel" in kernels) == (sweep_kernels == "persistent") and kernels


def test_a_forward_check_tells_that_its_stack_outgrew_its_room():
    # A stack that has not swept yet gives its buffer no room beyond the spare levels: its first long sweep outgrows
    # it, which a graph's replay must know before it concludes (an eager sweep would then run again).
    torch.manual_seed(0)
    rnn = ReversibleRNN("revlstm", 6, 10, buffer_lanes=2)
    x, mask = torch.randn(40, 4, 6), torch.ones(40, 4, dtype=torch.bool)
    tape = rnn.forward_sweep(TensorInput(x), mask, defer_checks=True)
    check, = tape.checks
    values, = read([check])
    assert check.outgrown(values)
    settle(tape)  # runs the sweep again with the room it needed
    again = rnn.forward_sweep(TensorInput(x), mask, defer_checks=True)
    check, = again.checks
    assert not check.outgrown(read([check])[0])


def test_without_cuda_graphs_a_run_trains_with_the_models_own_step():
    model = _model()
    assert training_step(model) == model.train_step


@pytest.mark.parametrize("options, message", [
    (["--device", "cpu"], "--cuda-graphs on needs a GPU (--device cuda), not --device cpu"),
    (["--device", "cpu", "--rnn", "gru"], "--cuda-graphs on captures the reversible training step"),
])
def test_cuda_graphs_on_is_refused_where_it_cannot_run(options, message, capsys):
    with pytest.raises(SystemExit) as stop:
        run_config(["--save-dir", "unused", "--cuda-graphs", "on", *options])
    assert stop.value.code == 2 and message in capsys.readouterr().err


class _RecordedGraph:
    """CUDA's graph API as far as GraphedSteps uses it, on a CPU: a capture runs its stretch (so the step made with it
    trains its batch as it would), a replay launches nothing."""

    def replay(self) -> None:
        pass


@pytest.fixture
def cpu_graphs(monkeypatch):
    class Stream:
        def __init__(self, *args) -> None:
            pass

        def wait_stream(self, other) -> None:
            pass

    for name, fake in {"Stream": Stream, "CUDAGraph": _RecordedGraph, "graph_pool_handle": lambda: None,
                       "graph": lambda graph, pool=None, stream=None: contextlib.nullcontext(),
                       "current_stream": Stream, "stream": lambda stream: contextlib.nullcontext(),
                       "memory_allocated": lambda device=None: 0}.items():
        monkeypatch.setattr(torch.cuda, name, fake)


def test_graphed_steps_warm_up_capture_replay_and_drop_shapes_in_turn(cpu_graphs):
    # The bookkeeping, with CUDA's graph API stood in for on a CPU (a replay computes nothing there, so only the steps
    # run eagerly or captured are compared with the eager model's): a shape's first step is eager, its second
    # captured, the later ones replayed; a cache of one shape drops the other.
    batches = [_batch(*shape, seed=i) for i, shape in enumerate(SHAPES[:5])]  # shapes A A B A B
    eager, want = _model(), []
    for batch in batches[:3]:
        eager.zero_grad(set_to_none=True)
        want.append((eager.train_step(*batch, normalizer=_tokens(batch)), [p.grad.clone() for p in eager.parameters()]))
    model = _model()  # the generator where it was for the eager model's steps
    graphs = GraphedSteps(model, shapes=1)
    done = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        done.append((graphs(*batch, normalizer=_tokens(batch)), [p.grad.clone() for p in model.parameters()]))
        done[-1] += (graphs.eager, graphs.captures, graphs.replays, list(graphs.captured))
    # A eager, A captured, B eager (A kept), A replayed, B captured (A dropped)
    assert [d[2:5] for d in done] == [(1, 0, 0), (1, 1, 0), (2, 1, 0), (2, 1, 1), (2, 2, 1)]
    assert [len(d[5]) for d in done] == [0, 1, 1, 1, 1] and done[4][5] != done[3][5]
    # the eager and the captured steps train as the eager model does
    for (result, grads, *_), (reference, reference_grads) in zip(done, want):
        assert torch.equal(result.loss, reference.loss) and result.held_bytes == reference.held_bytes
        assert all(torch.equal(g, w) for g, w in zip(grads, reference_grads))


def test_a_capture_whose_batch_outgrew_its_room_trains_it_eagerly_and_keeps_no_graph(cpu_graphs, monkeypatch):
    from revnmt.rnn import reversible

    batch = _batch(8, 7, 6, seed=0)
    reference = _model()
    reference.train_step(*batch, normalizer=_tokens(batch))
    reference.zero_grad(set_to_none=True)
    want = reference.train_step(*batch, normalizer=_tokens(batch))
    model = _model()  # the generator where it was for the reference's steps
    graphs = GraphedSteps(model)
    graphs(*batch, normalizer=_tokens(batch))
    # every forward check from now on says its stack outgrew its room (concluding it would run the sweep again)
    def outgrowing(values, conclude, outgrown=None):
        return Check(values, conclude) if outgrown is None else Check(values, conclude, lambda v: True)

    monkeypatch.setattr(reversible, "Check", outgrowing)
    model.zero_grad(set_to_none=True)
    got = graphs(*batch, normalizer=_tokens(batch))
    assert (graphs.eager, graphs.captures, len(graphs.captured)) == (2, 0, 0)
    assert torch.equal(got.loss, want.loss)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))


def test_a_capture_measures_what_its_shape_keeps_for_its_replays(cpu_graphs, monkeypatch):
    # What the allocator holds after a capture beyond what it held before, less the loss handed out, is the shape's
    # (its tapes and static inputs): the memory budget counts it for every shape kept, and its probe measures it.
    from revnmt.data import Batch
    from revnmt.memory.peak import PeakMeter
    from revnmt.training.graphs import probe_graphed_step

    allocated = iter([5_000, 5_000 + 1_234 + 4, 7_000, 7_000 + 777 + 4])  # a float32 loss: 4 bytes
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: next(allocated))
    batch = _batch(8, 7, 6, seed=0)
    graphs = GraphedSteps(_model())
    for _ in range(2):  # warmed up, then captured
        graphs(*batch, normalizer=_tokens(batch))
    assert graphs.captures == 1 and graphs.kept_bytes == 1_234
    src, src_len, tgt_in, tgt_out = batch
    measured = probe_graphed_step(_model(), Batch(src, src_len, tgt_in, tgt_out, src_len, int(_tokens(batch)),
                                                  list(range(8))), PeakMeter("cpu"))
    assert measured.kept == 777


# ---------------------------------------------------------------------------------------------------- on a GPU


def _train(model, step, batches, parts: int = 1):
    """Adam updates of ``parts`` consecutive batches each, trained by ``step``: each update's loss, gradients and
    weights after it."""
    optimizer = build_optimizer(TrainingConfig(save_dir="unused"), model.parameters())
    seen = []
    for i in range(0, len(batches), parts):
        update = batches[i: i + parts]
        model.zero_grad(set_to_none=True)
        tokens = sum(_tokens(b) for b in update)
        loss = sum(step(*b, normalizer=tokens).loss for b in update)
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        seen.append((loss, grads, [p.detach().clone() for p in model.parameters()]))
    return seen


def _twins(batches, parts: int = 1, **model):
    """The eager step's training on ``batches``, and a twin model for the graphs to train: the same weights, and the
    generator that draws the dropout masks where it was for the eager model (``_model`` seeds it)."""
    eager = _model(device="cuda", **model)
    want = _train(eager, eager.train_step, batches, parts)
    return want, _model(device="cuda", **model)


def _assert_same_training(got, want):
    assert len(got) == len(want)
    for (loss, grads, weights), (loss_w, grads_w, weights_w) in zip(got, want):
        assert torch.equal(loss, loss_w)
        assert all(torch.equal(g, w) for g, w in zip(grads, grads_w))
        assert all(torch.equal(g, w) for g, w in zip(weights, weights_w))


# 8 sentences: one buffer tile, which the persistent kernels take (the per-step ones take any)
SHAPES = [(8, 7, 6), (8, 7, 6), (8, 9, 5), (8, 7, 6), (8, 9, 5), (8, 7, 6), (8, 9, 5), (8, 7, 6)]


def _cuda_batches(shapes=SHAPES):
    return [_batch(*shape, seed=i, device="cuda") for i, shape in enumerate(shapes)]


@cuda
@pytest.mark.parametrize("rnn", ["revgru", "revlstm"])
@pytest.mark.parametrize("sweep_kernels", ["steps", "persistent"])
def test_cuda_graphs_train_bit_for_bit_as_the_eager_step(rnn, sweep_kernels):
    # Two shapes, each warmed up once, captured, then replayed: the losses, gradients and Adam's weights are the
    # eager step's bit for bit, the dropout masks drawn from the same generator.
    batches = _cuda_batches()
    want, model = _twins(batches, rnn=rnn, sweep_kernels=sweep_kernels)
    graphs = GraphedSteps(model, warmup=1)
    _assert_same_training(_train(model, graphs, batches), want)
    assert (graphs.eager, graphs.captures, graphs.replays) == (2, 2, 4)


@cuda
def test_cuda_graphs_add_up_an_update_of_several_parts():
    # --update-freq 2: parts of one shape and of two, replayed or eager, add into .grad as the eager step does.
    batches = _cuda_batches()
    want, model = _twins(batches, parts=2)
    graphs = GraphedSteps(model, warmup=1)
    _assert_same_training(_train(model, graphs, batches, parts=2), want)
    assert graphs.replays > 0


@cuda
def test_cuda_graphs_keep_at_most_their_shapes_and_capture_a_dropped_one_again():
    batches = _cuda_batches()
    want, model = _twins(batches)
    graphs = GraphedSteps(model, shapes=1, warmup=1)
    _assert_same_training(_train(model, graphs, batches), want)
    assert len(graphs.captured) == 1 and graphs.captures > 2


@cuda
def test_a_cuda_graph_replay_that_outgrew_its_room_trains_the_batch_eagerly(monkeypatch):
    # The stack room is frozen in a graph: a batch that outgrows it is trained eagerly (its sweep runs again with
    # more room, as without graphs), and its shape is captured anew at its next batch.
    batches = _cuda_batches([(8, 7, 6)] * 4)
    want, model = _twins(batches)
    graphs = GraphedSteps(model, warmup=1)
    got = _train(model, graphs, batches[:2])  # warmed up, then captured
    captured, = graphs.captured.values()
    monkeypatch.setattr(captured.checks[0], "outgrown", lambda values: True)
    got += _train(model, graphs, batches[2:3])
    assert not graphs.captured and graphs.eager == 2
    got += _train(model, graphs, batches[3:])
    _assert_same_training(got, want)
    assert graphs.captures == 2


@cuda
def test_a_step_that_cannot_be_captured_stops_with_one_clear_error(monkeypatch):
    # A host read inside a stretch (here a stand-in: .item() in the forward sweeps) makes the capture fail: the run
    # stops with GraphCaptureError, which revnmt-train reports in one line, naming --cuda-graphs off.
    from revnmt.training.graphs import GraphCaptureError

    model = _model(device="cuda")
    graphs = GraphedSteps(model, warmup=1)
    batch = _batch(8, 7, 6, seed=0, device="cuda")
    graphs(*batch, normalizer=_tokens(batch))
    reversal = model.reversal

    def reading(*args, **kwargs):
        step = reversal(*args, **kwargs)
        step.enc_tape.states[0].sum().item()
        return step

    monkeypatch.setattr(model, "reversal", reading)
    with pytest.raises(GraphCaptureError, match="--cuda-graphs off"):
        graphs(*batch, normalizer=_tokens(batch))


@cuda
def test_revnmt_train_with_cuda_graphs_on_saves_the_run_of_cuda_graphs_off(train, tmp_path):
    # Two epochs of the toy corpus, whose batches of 32 sentences repeat their shapes: the weights, the optimizer's
    # moments and the dev scores of a run with graphs are those of the run without, bit for bit.
    options = ["--device", "cuda", "--encoder", "bidirectional", "--epochs", "2", "--dropout", "0.3"]
    for graphs in ("off", "on"):
        assert train(tmp_path / graphs, *options, "--cuda-graphs", graphs) == 0
    off, on = (Checkpoint.load(tmp_path / graphs / "last.pt") for graphs in ("off", "on"))
    assert off.weights.keys() == on.weights.keys()
    assert all(torch.equal(off.weights[name], on.weights[name]) for name in off.weights)
    moments = list(zip(*(run.training.optimizer["state"].values() for run in (off, on))))
    assert moments and all(torch.equal(a["exp_avg"], b["exp_avg"]) for a, b in moments)

    def dev(run: str) -> list[list[str]]:  # every validation's epoch, step, loss, perplexity and BLEU
        return [line.split("\t")[:5] for line in (tmp_path / run / "valid.tsv").read_text().splitlines()]

    assert dev("off") == dev("on")


@cuda
def test_cuda_graphs_under_a_memory_budget_keep_the_reserved_peak_within_it():
    # The plan counts what the graphs keep: the graphs' pool beside the eager steps' cache, and every kept shape's
    # tapes. Training the plan's batches at several lengths, each shape warmed up, captured and replayed, stays in.
    import numpy as np

    from revnmt.memory.budget import base_bytes, plan_budget, synthetic_batch
    from revnmt.memory.peak import PeakMeter, release_free_memory
    from revnmt.training.graphs import probe_graphed_step

    device, mib = torch.device("cuda"), 2 ** 20
    lengths = np.array([4, 6, 9, 12, 16, 20, 25, 30] * 40)
    model = _model(device="cuda")
    meter = PeakMeter(device)
    budget = int((base_bytes(model, "adam", meter) + 128 * mib) / 0.9)
    plan = plan_budget(model, budget, "adam", lengths, device, probe=probe_graphed_step, shapes=3,
                       held_for_good=GraphedSteps.gradient_bytes(model))
    eager = plan_budget(model, budget, "adam", lengths, device)
    assert plan.kept_bytes > 0 and plan.batch_tokens <= eager.batch_tokens
    graphs = GraphedSteps(model, shapes=3, warmup=1)
    optimizer = torch.optim.Adam(model.parameters())
    release_free_memory(device)
    meter.reset()
    for length in (4, 12, 30):
        sentences = min(plan.batch_tokens // length, int((lengths <= length).sum()))
        batch = synthetic_batch(sentences, length, VOCAB, VOCAB, device)
        for _ in range(3):  # warm-up, capture, replay
            graphs(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, float(batch.n_tokens))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    assert graphs.captures == 3 and graphs.kept_bytes <= plan.shapes * plan.kept_bytes
    assert meter.peak() <= budget and meter.live() <= budget


@cuda
def test_revnmt_train_with_cuda_graphs_on_plans_a_memory_budget_with_them(train, tmp_path, caplog):
    # --memory-budget with --cuda-graphs on: the plan measures the graphed step and counts the kept shapes; the
    # run trains within it.
    import logging

    caplog.set_level(logging.INFO)
    options = ["--device", "cuda", "--epochs", "1", "--memory-budget", "1GiB", "--cuda-graph-shapes", "8"]
    assert train(tmp_path / "run", *options, "--cuda-graphs", "on") == 0
    assert "CUDA graphs of up to 8 batch shapes" in caplog.text
    plan = Checkpoint.load(tmp_path / "run" / "last.pt").memory_plan
    assert plan["shapes"] == 8 and plan["kept_bytes"] > 0
