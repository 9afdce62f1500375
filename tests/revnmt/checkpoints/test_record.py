"""The checkpoint record: what it writes, what it reads back (format 1, as revnmt wrote checkpoints before they
had a version, included), and the formats it refuses."""

import platform
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from revnmt.checkpoints import (
    FORMAT,
    RESUMING,
    AveragedFrom,
    Checkpoint,
    CheckpointError,
    Numerics,
    TrainerState,
    TrainingState,
    rng_state,
    save_checkpoint,
)
from revnmt.checkpoints.files import read_checkpoint_file
from revnmt.checkpoints.record import _processor
from revnmt.data import DataOptions, Vocabulary
from revnmt.model import ModelConfig, build_model

VOCAB = Vocabulary(["a", "man", "dog"])
CONFIG = ModelConfig(rnn="revgru", emb_dim=8, hidden_size=8, slice_dim=2, src_vocab=len(VOCAB),
                     tgt_vocab=len(VOCAB))


def _trained(**changes) -> Checkpoint:
    """A checkpoint as training writes it, of a tiny model after one Adam update; ``changes`` replace its fields."""
    torch.manual_seed(0)
    model = build_model(CONFIG)
    optimizer = torch.optim.Adam(model.parameters())
    sum(weight.sum() for weight in model.parameters()).backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    trainer = TrainerState(epoch=2, batch_in_epoch=3, step=10, best_bleu=1.5, best_step=7)
    training = TrainingState(optimizer.state_dict(), scheduler.state_dict(), trainer, rng_state())
    checkpoint = Checkpoint(CONFIG, model.state_dict(), VOCAB.itos, VOCAB.itos,
                            DataOptions("en", "de", lowercase=True, max_len=50), args={"seed": 1, "lr": 1e-3},
                            training=training, data_fingerprint={"train.en": {"bytes": 10}},
                            memory_plan={"batch_tokens": 100}, numerics=Numerics("2.13.0+cpu", "cpu", 2))
    return replace(checkpoint, **changes)


def _same(a, b) -> bool:
    """Exact equality of nested state (dicts, lists, tuples, tensors, numbers)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def test_a_checkpoint_round_trips_in_the_current_format(tmp_path: Path) -> None:
    path, checkpoint = tmp_path / "last.pt", _trained()
    checkpoint.save(path)
    assert read_checkpoint_file(path)["format"] == FORMAT == 3
    loaded = Checkpoint.load(path, needs=RESUMING)
    assert _same(loaded.to_dict(), checkpoint.to_dict())
    assert loaded.model_config == CONFIG and loaded.data == checkpoint.data and loaded.args == checkpoint.args
    assert loaded.training.trainer == checkpoint.training.trainer and loaded.step == 10
    assert loaded.data_fingerprint == checkpoint.data_fingerprint and loaded.memory_plan == {"batch_tokens": 100}
    assert loaded.averaged_from is None and loaded.numerics == Numerics("2.13.0+cpu", "cpu", 2)


def test_numerics_name_what_changed() -> None:
    saved, here = Numerics("2.13.0+cpu", "cpu", 1), Numerics.of("cpu")
    assert here.torch == torch.__version__ and here.threads == torch.get_num_threads()
    assert saved.changes_to(saved) == []
    assert saved.changes_to(Numerics("2.13.0+cpu", "NVIDIA H200", 2)) == ["device cpu -> NVIDIA H200",
                                                                          "threads 1 -> 2"]
    assert saved.describe() == "torch 2.13.0+cpu on cpu, 1 thread"


def test_numerics_name_the_processor_whose_kernels_the_cpu_runs() -> None:
    """An AVX-512 processor sums in another order than an AVX2 one: a resume on it must say so."""
    here = Numerics.of("cpu")
    assert here.cpu.endswith(f" ({torch.backends.cpu.get_cpu_capability()})") and len(here.cpu) > 3
    assert here.describe().endswith(f", {here.cpu}")
    epyc = Numerics("2.13.0+cpu", "cpu", 1, "AMD EPYC 7B13 (AVX2)")
    assert epyc.changes_to(replace(epyc, cpu="Intel(R) Xeon(R) Processor @ 2.80GHz (AVX512)")) == [
        "cpu AMD EPYC 7B13 (AVX2) -> Intel(R) Xeon(R) Processor @ 2.80GHz (AVX512)"]
    # a checkpoint that did not record its processor cannot promise the same bits on this one
    assert Numerics("2.13.0+cpu", "cpu", 1).changes_to(epyc) == ["cpu (not recorded) -> AMD EPYC 7B13 (AVX2)"]
    with pytest.raises(TypeError):
        Numerics("2.13.0+cpu", "cpu", 1, 7)


def test_the_processor_is_named_with_its_family_and_model_where_the_name_hides_its_generation(tmp_path: Path) -> None:
    # A virtual machine showed "AMD EPYC" for a processor that repeated one committed Multi30K log and not another:
    # x86's family and model numbers tell generations apart that such a name does not. The first processor's block.
    info = tmp_path / "cpuinfo"
    block = "processor\t: {0}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {1}\nmodel name\t: AMD EPYC\n"
    info.write_text(block.format(0, 17) + "\n" + block.format(1, 1))
    assert _processor(str(info)) == "AMD EPYC, x86 family 25 model 17"
    arm = tmp_path / "cpuinfo-arm"  # an Arm machine: no model name (another path: a process asks once a path)
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n")
    assert _processor(str(arm)) == (platform.processor() or platform.machine() or "unknown processor")
    assert _processor(str(tmp_path / "missing")) == _processor(str(arm))


def test_a_format_2_checkpoint_loads_without_numerics(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    stored = _trained().to_dict()
    del stored["numerics"]
    save_checkpoint(path, stored | {"format": 2})
    loaded = Checkpoint.load(path, needs=RESUMING)
    assert loaded.numerics is None and _same(loaded.weights, _trained().weights)


def test_an_average_round_trips_without_a_training_state(tmp_path: Path) -> None:
    path = tmp_path / "average.pt"
    averaged_from = AveragedFrom(["a.pt", "b.pt"], [5, None])
    _trained(training=None, data_fingerprint=None, memory_plan=None, numerics=None,
             averaged_from=averaged_from).save(path)
    assert set(read_checkpoint_file(path)) == {"format", "model_config", "model", "src_vocab", "tgt_vocab", "data",
                                                "args", "averaged_from"}
    loaded = Checkpoint.load(path)
    assert loaded.averaged_from == averaged_from and loaded.training is None and loaded.step is None
    with pytest.raises(CheckpointError, match=r"it has no optimizer, scheduler, trainer, rng\)$"):
        Checkpoint.load(path, needs=RESUMING)


def _format_1(checkpoint: Checkpoint) -> dict:
    """What Trainer.checkpoint() wrote before checkpoints had a format version: no "format", every key, in its
    order, the optional ones as None."""
    stored = checkpoint.to_dict()
    return {key: stored.get(key) for key in ("model_config", "model", "src_vocab", "tgt_vocab", "data",
                                             "data_fingerprint", "optimizer", "scheduler", "trainer", "rng", "args",
                                             "memory_plan")}


def test_a_format_1_checkpoint_loads_with_defaults_for_what_its_writer_did_not_know(tmp_path: Path) -> None:
    path, checkpoint = tmp_path / "last.pt", _trained(data_fingerprint=None, memory_plan=None, numerics=None)
    stored = _format_1(checkpoint)
    # Older still: from before these model options, subwords and these trainer counters.
    for key in ("label_smoothing", "share_embeddings"):
        del stored["model_config"][key]
    del stored["data"]["src_spm"], stored["data"]["tgt_spm"]
    del stored["trainer"]["nonfinite_in_a_row"], stored["trainer"]["validation_due"]
    save_checkpoint(path, stored)
    loaded = Checkpoint.load(path, needs=RESUMING)
    assert loaded.model_config == CONFIG and loaded.data == checkpoint.data
    assert loaded.training.trainer == checkpoint.training.trainer
    assert loaded.data_fingerprint is None and loaded.memory_plan is None
    # Saved again, it is the current format, holding what it held.
    assert _same(loaded.to_dict(), checkpoint.to_dict())
    assert _same(loaded.trained_model().state_dict(), checkpoint.weights)


def test_a_newer_format_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "future.pt"
    save_checkpoint(path, _trained().to_dict() | {"format": FORMAT + 1, "something": "new"})
    with pytest.raises(CheckpointError) as refused:
        Checkpoint.load(path)
    assert str(refused.value) == (f"cannot load checkpoint {path}: it has checkpoint format {FORMAT + 1}, newer than "
                                  f"this revnmt reads (up to {FORMAT}): load it with the newer revnmt that wrote it")


@pytest.mark.parametrize("version", ["2", 2.0, True, 0, None])
def test_a_format_that_is_no_version_is_refused(tmp_path: Path, version) -> None:
    path = tmp_path / "odd.pt"
    save_checkpoint(path, _trained().to_dict() | {"format": version})
    with pytest.raises(CheckpointError, match=rf"its format {version!r} is not a checkpoint format$"):
        Checkpoint.load(path)


@pytest.mark.parametrize("change, message", [
    (lambda stored: stored.pop("rng"), r"not a revnmt checkpoint \(it has no rng\)$"),
    (lambda stored: stored["trainer"].update(colour=1), r"its trainer is not valid \(TrainerState.__init__\(\) got an "
     r"unexpected keyword argument 'colour'\)$"),
    (lambda stored: stored.update(averaged_from={"steps": [1]}), r"its averaged_from is not valid \("),
    (lambda stored: stored.update(memory_plan=[1]), r"its memory_plan is a list, not a dict$"),
    (lambda stored: stored["numerics"].update(threads="2"), r"its numerics is not valid \(threads must be a positive "
     r"whole number, not '2'\)$"),
    (lambda stored: stored["numerics"].update(threads=0), r"its numerics is not valid \(threads must be"),
    (lambda stored: stored["numerics"].update(device=None), r"its numerics is not valid \(torch, device and cpu must"),
    (lambda stored: stored["numerics"].update(cpu=b"AVX2"), r"its numerics is not valid \(torch, device and cpu must"),
    (lambda stored: stored["numerics"].pop("torch"), r"its numerics is not valid \("),
    (lambda stored: stored.update(numerics=[2]), r"its numerics is a list, not a dict$"),
], ids=["part-of-a-training-state", "unknown-counter", "averaged-from", "memory-plan", "numerics-threads-text",
        "numerics-no-threads", "numerics-device", "numerics-cpu", "numerics-missing", "numerics-list"])
def test_parts_that_are_not_what_they_should_be_are_refused(tmp_path: Path, change, message: str) -> None:
    path, stored = tmp_path / "odd.pt", _trained().to_dict()
    change(stored)
    save_checkpoint(path, stored)
    with pytest.raises(CheckpointError, match=message):
        Checkpoint.load(path)
