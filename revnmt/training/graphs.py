"""CUDA graphs of the reversible training step (``--cuda-graphs on``): each batch shape's step captured once, then
replayed for every later batch of that shape.

On a GPU a reversible step is thousands of small kernel launches (docs/gpu.md#the-launch-trace), each costing the
host tens of microseconds, so at the batch sizes NMT trains with the step waits on the host, not on the GPU. Which
kernels it launches, with which grids and arguments, depends on the batch's shape only: the sweeps read nothing on
the host (their stacks get their room before they start), and the step reads twice, the forward sweeps' checks and
then the reverses' exactness guards. So the step is two stretches of launches, the forward sweeps and the backward
(:class:`revnmt.model.reversible.Reversal`), and each is captured in a CUDA graph and replayed as one launch.

- **Static inputs.** A captured step reads its batch, its dropout masks and its normalizer from tensors of its own,
  which a replay fills first. The masks are drawn outside the graphs, where the eager step draws them, so the random
  streams and every result are the eager step's, bit for bit.
- **Warm-up.** A shape's first ``warmup`` steps run eagerly on the capture stream, so that Triton compiles its
  kernels and cuBLAS makes its workspace there before a capture; the next one is captured, then replayed for its own
  results.
- **What a replay cannot do.** A batch whose stack outgrows the room frozen into the graph (the eager sweep would
  run again with more) runs eagerly instead, and its shape is captured anew at its next batch, with the room learned
  from it. Bad input and a failed exactness guard raise exactly as in the eager step.
- **Gradients** accumulate, inside the graphs, into one set of tensors of this object's that every shape shares,
  and which are the parameters' ``.grad`` after a step: a step of several parts (``--update-freq``) adds up as the
  eager one does.
- **Memory.** Every graph captures into one pool, which holds the largest step's working memory for good; each
  shape also keeps its tapes' buffers and states and its static inputs (``shapes`` shapes at most, the least
  recently used dropped first), bytes measured when it is captured (:attr:`CapturedStep.kept_bytes`). A memory budget
  plans with :func:`probe_graphed_step` and counts every kept shape (:mod:`revnmt.memory.budget`).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import fields

import torch
from torch.utils._pytree import tree_leaves, tree_map

from buffers import FixedPointOverflowError
from revnmt.data import Batch
from revnmt.memory.budget import Measured, measured_bytes
from revnmt.memory.peak import PeakMeter
from revnmt.model import Seq2Seq, StepResult
from revnmt.model.reversible import ReversibleSeq2Seq
from revnmt.model.seq2seq import DropoutMasks
from revnmt.rnn import ReversalError
from revnmt.rnn.tape import conclude, pop_checks

logger = logging.getLogger(__name__)


class GraphCaptureError(RuntimeError):
    """A batch shape's step could not be captured in a CUDA graph (an operation a capture does not allow)."""

TrainStep = Callable[..., StepResult]  # model.train_step's signature: (src, src_len, tgt_in, tgt_out, normalizer)


def training_step(model: Seq2Seq) -> TrainStep:
    """What trains a batch: ``model.train_step``, or its CUDA graphs where ``--cuda-graphs on`` asks for them."""
    execution = model.execution
    if execution.cuda_graphs == "off":
        return model.train_step
    if not isinstance(model, ReversibleSeq2Seq) or next(model.parameters()).device.type != "cuda":
        raise ValueError("--cuda-graphs on captures a reversible model's training step on a GPU")
    return GraphedSteps(model, shapes=execution.cuda_graph_shapes)


def _mask_tensors(masks: DropoutMasks) -> list[torch.Tensor]:
    return [t for f in fields(masks) for t in tree_leaves(getattr(masks, f.name)) if isinstance(t, torch.Tensor)]


class GraphedSteps:
    """``model.train_step`` by CUDA graphs, one pair a batch shape: call it as that step (same arguments, same
    result, same ``.grad``). ``replays``, ``captures`` and ``eager`` count the steps each way."""

    def __init__(self, model: ReversibleSeq2Seq, shapes: int = 64, warmup: int = 1) -> None:
        if warmup < 1:
            raise ValueError("a shape's first step runs eagerly before its capture (warmup >= 1): Triton compiles and "
                             "lazily made constants must not happen inside a capture")
        self.model, self.shapes, self.warmup = model, shapes, warmup
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grads = [torch.zeros_like(p) for p in self.params]  # every graph accumulates into these
        device = self.params[0].device
        self.stream = torch.cuda.Stream(device)  # warm-ups and captures run here, as CUDA graphs need
        self.pool = torch.cuda.graph_pool_handle()
        self.captured: OrderedDict[tuple, CapturedStep] = OrderedDict()
        self.seen: Counter[tuple] = Counter()  # eager steps of each shape since its last capture
        # the parameters a step leaves without a gradient (learned from the first, eager, step): they keep .grad None
        # after a graph too, as Adam skips them only then
        self.untrained: list[torch.nn.Parameter] | None = None
        self.replays = self.captures = self.eager = 0

    def __call__(self, src: torch.Tensor, src_len: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                 normalizer: float) -> StepResult:
        masks = self.model.draw_masks(src.shape[0], src.device)  # as train_step draws them: the same streams
        key = (tuple(src.shape), tuple(tgt_in.shape))
        step = self.captured.get(key)
        if step is not None:
            self.captured.move_to_end(key)
            self._hand_grads_to_graphs()
            result = step.replay(src, tgt_in, tgt_out, normalizer, masks)
            if result is not None:
                self.replays += 1
                return self._untrained_without_grads(result)
            del self.captured[key]  # this batch outgrew the room frozen in its graphs: capture the shape anew
            logger.info("a batch of shape %s outgrew its CUDA graph's stack room: run eagerly, captured again", key)
        elif self.seen[key] >= self.warmup:
            self._hand_grads_to_graphs()
            allocated = torch.cuda.memory_allocated(src.device)
            try:
                step = CapturedStep(self, src, tgt_in, tgt_out, normalizer, masks)
            except (ReversalError, FixedPointOverflowError):
                raise  # the batch's own, as in the eager step: the caller's fallbacks handle them
            except RuntimeError as error:
                raise GraphCaptureError(f"the training step of a batch of shape {key} could not be captured in a "
                                        f"CUDA graph ({str(error).splitlines()[0]}): train with --cuda-graphs off"
                                        ) from error
            result = step.result
            # what the capture left allocated (the stretches' own tensors went back to the pool with their
            # Reversal) is what the shape keeps from one replay to the next, less the loss handed out
            step.kept_bytes = torch.cuda.memory_allocated(src.device) - allocated - (
                0 if result is None else result.loss.untyped_storage().nbytes())
            if result is not None:
                self.seen.pop(key)
                self.captured[key] = step
                if len(self.captured) > self.shapes:
                    self.captured.popitem(last=False)
                self.captures += 1
                return self._untrained_without_grads(result)
        self.seen[key] += 1
        self.eager += 1
        first = self.untrained is None
        if first:
            before = [p for p in self.params if p.grad is None]
        with self._on_stream():
            result = self.model.train_step(src, src_len, tgt_in, tgt_out, normalizer, masks)
        if first:
            self.untrained = [p for p in before if p.grad is None]
        return result

    @staticmethod
    def gradient_bytes(model: ReversibleSeq2Seq) -> int:
        """Bytes of the gradient accumulators every shape's graphs share, held from the first step on (an eager step's
        ``.grad`` is freed by ``zero_grad``)."""
        return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)

    @property
    def kept_bytes(self) -> int:
        """Bytes the kept shapes' graphs hold between steps (their tapes and static inputs), as measured at each
        capture by the CUDA allocator."""
        return sum(step.kept_bytes for step in self.captured.values())

    def _untrained_without_grads(self, result: StepResult) -> StepResult:
        """``result``, the parameters no step trains left with ``.grad`` None (a graph gave them zeros)."""
        for p in self.untrained or ():
            p.grad = None
        return result

    def _on_stream(self) -> _Joined:
        """Run on the capture stream (after what the current stream has queued), the current one waiting for it
        afterwards: every step is in stream order with the optimizer's."""
        self.stream.wait_stream(torch.cuda.current_stream())
        return _Joined(self.stream)

    def _hand_grads_to_graphs(self) -> None:
        """Make :attr:`grads` the parameters' ``.grad``, holding what ``.grad`` holds now (the update's earlier
        parts; zeros after ``zero_grad``), so that a graph adds into them."""
        unset = [mine for p, mine in zip(self.params, self.grads) if p.grad is None]
        if unset:
            torch._foreach_zero_(unset)
        for p, mine in zip(self.params, self.grads):
            if p.grad is not None and p.grad is not mine:
                mine.copy_(p.grad)
            p.grad = mine


def probe_graphed_step(model: ReversibleSeq2Seq, batch: Batch, meter: PeakMeter) -> Measured:
    """A memory budget's probe (:data:`revnmt.memory.budget.Probe`) of a batch shape's step with CUDA graphs, as
    training takes its first two: the eager warm-up, then the capture into a fresh pool (the graphs' pool then
    holding the step's working memory beside the eager steps' cache). Its peak, and what the capture keeps."""
    kept = []

    def first_two_steps() -> None:
        steps = GraphedSteps(model, shapes=1)
        for _ in range(steps.warmup + 1):
            steps(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, normalizer=float(batch.n_tokens))
        kept.append(steps.kept_bytes)

    return Measured(measured_bytes(model, meter, first_two_steps), kept[0])


class _Joined:
    """Run on ``stream``, and let the current stream wait for it afterwards."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream, self.outer = stream, torch.cuda.current_stream()
        self.context = torch.cuda.stream(stream)

    def __enter__(self) -> None:
        self.context.__enter__()

    def __exit__(self, *exc) -> None:
        self.context.__exit__(*exc)
        self.outer.wait_stream(self.stream)


class CapturedStep:
    """One batch shape's step as two CUDA graphs, the forward sweeps and the backward, captured when made (which
    also trains the batch it was made with: :attr:`result`, None if that batch outgrew the room and nothing was
    captured) and replayed by :meth:`replay`."""

    def __init__(self, steps: GraphedSteps, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor,
                 normalizer: float, masks: DropoutMasks) -> None:
        model = steps.model
        self.src, self.tgt_in, self.tgt_out = src.clone(), tgt_in.clone(), tgt_out.clone()
        self.normalizer = torch.full((), float(normalizer), device=src.device)
        self.masks = DropoutMasks(**{f.name: tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t,
                                                      getattr(masks, f.name)) for f in fields(masks)})
        self.inputs = [self.src, self.tgt_in, self.tgt_out, *_mask_tensors(self.masks)]
        self.result: StepResult | None = None
        self.kept_bytes = 0  # measured by GraphedSteps once made
        with steps._on_stream():
            self.forward = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.forward, pool=steps.pool, stream=steps.stream):
                reversal = model.reversal(self.src, self.tgt_in, self.tgt_out, self.normalizer, self.masks)
            self.checks = pop_checks(*reversal.tapes)
            self.forward.replay()
            if not conclude(self.checks, room_fixed=True):  # the batch outgrew the room: nothing to capture
                return
            self.backward = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.backward, pool=steps.pool, stream=steps.stream):
                reversal.backward()
            self.guards = pop_checks(*reversal.tapes)
            self.outputs = reversal.result
            self.backward.replay()
            self.result = self._finish()

    def _finish(self) -> StepResult:
        """Read the exactness guards (ReversalError if one fails) and hand out this replay's loss."""
        conclude(self.guards)
        return StepResult(self.outputs.loss.clone(), self.outputs.held_bytes)

    def replay(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor, normalizer: float,
               masks: DropoutMasks) -> StepResult | None:
        """Train this batch of the captured shape: its gradients added to ``.grad``, its loss returned; None (and
        no gradients) if it outgrew the graph's room, for the caller to train it eagerly."""
        torch._foreach_copy_(self.inputs, [src, tgt_in, tgt_out, *_mask_tensors(masks)])
        self.normalizer.fill_(float(normalizer))
        self.forward.replay()
        if not conclude(self.checks, room_fixed=True):
            return None
        self.backward.replay()
        return self._finish()
