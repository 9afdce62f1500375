import json
from dataclasses import FrozenInstanceError

import pytest
import torch

from revnmt.arguments import run_config as parse_args
from revnmt.checkpoints import Checkpoint
from revnmt.data import DataOptions
from revnmt.model import ModelConfig
from revnmt.training import RunConfig

REQUIRED = ["--save-dir", "runs/x"]


def _checkpoint(args: dict, model_config: ModelConfig) -> Checkpoint:
    """A checkpoint of a run of these options, holding what RunConfig.from_checkpoint reads (no weights)."""
    return Checkpoint(model_config, {}, [], [], DataOptions("en", "de", lowercase=False, max_len=None), args=args)


@pytest.mark.parametrize("options, message", [
    (["--rnn", "rnn"], "invalid choice: 'rnn'"),
    (["--hidden-size", "15"], "--hidden-size must be even"),
    (["--slice-dim", "200"], "--slice-dim must be in [1, hidden_size/2 = 150]"),
    (["--max-forget-bits", "4"], "--max-forget-bits must be one of 1, 2, 3, 5 or none"),
    (["--dropout", "1.0"], "--dropout must be in [0, 1)"),
    (["--label-smoothing", "1"], "--label-smoothing must be in [0, 1), got 1.0"),
    (["--label-smoothing", "-0.1"], "--label-smoothing must be in [0, 1), got -0.1"),
    (["--emb-dim", "0"], "--emb-dim must be a positive integer, got 0"),
    (["--encoder", "both"], "invalid choice: 'both'"),
    (["--tie-embeddings", "--emb-dim", "256"], "--emb-dim must equal it, got 256 and 300"),
    (["--train", "data/train"], "--train and --valid go together"),
    (["--data", "multi30k", "--train", "a", "--valid", "b"], "not both"),
    (["--batch-size", "0"], "must be a positive integer"),
    (["--lr", "-1"], "must be positive"),
    (["--lr-decay", "1.5"], "--lr-decay must be in (0, 1)"),
    (["--clip", "-1"], "--clip must be >= 0"),
    (["--lr", "1e-6"], "--lr 1e-06 is below --min-lr 1e-05"),
    (["--device", "gpu0"], "is not a torch device"),
    (["--buffer-backend", "cudnn"], "invalid choice: 'cudnn'"),
    (["--checkpoint-steps", "4"], "--checkpoint-steps is for ordinary RNNs"),
    (["--sweep-kernels", "persistent", "--buffer-backend", "numba"],
     "--sweep-kernels persistent runs on the triton backend, not --buffer-backend numba"),
    (["--sweep-kernels", "fused"], "invalid choice: 'fused'"),
    (["--rnn", "gru", "--checkpoint-steps", "sqrt"], "must be a positive number of steps or auto, got sqrt"),
    (["--rnn", "gru", "--checkpoint-steps", "0"], "must be a positive number of steps or auto, got 0"),
    (["--buffer-backend", "numba", "--device", "meta"], "--buffer-backend: the numba buffer backend runs on CPU only"),
    (["--subword", "wordpiece"], "invalid choice: 'wordpiece'"),
    (["--vocab-size", "4000"], "--vocab-size and --joint-vocab shape the SentencePiece models --subword trains"),
    (["--subword", "none", "--no-joint-vocab"], "give --subword bpe or unigram"),
    (["--subword", "bpe", "--vocab-size", "0"], "must be a positive integer"),
    (["--spm-model", "a.model", "--subword", "bpe", "--vocab-size", "10"],
     "--spm-model brings its own SentencePiece models: leave out --subword, --vocab-size"),
    (["--spm-model", "a", "b", "c"], "--spm-model takes one model for both languages, or two (source, target): got 3"),
])
def test_bad_options_are_usage_errors(options, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*REQUIRED, *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert ": error: " in err and message in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_a_gpu_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse_args([*REQUIRED, "--device", "cuda"])
    assert "no CUDA device" in capsys.readouterr().err


def test_defaults_depend_on_data_and_optimizer():
    config = parse_args(REQUIRED)
    data, model, training = config.data, config.model, config.training
    assert (data.data, data.lowercase, training.optimizer, training.lr, training.batch_size) == (
        "multi30k", True, "adam", 1e-3, 64)
    assert (model.rnn, model.attention, model.slice_dim, model.max_forget_bits) == ("revgru", "emb+slice", 20, 3)
    config = parse_args([*REQUIRED, "--train", "t", "--valid", "v", "--optimizer", "sgd", "--batch-tokens", "2000",
                         "--max-forget-bits", "none"])
    assert (config.data.data, config.data.lowercase, config.training.lr, config.training.batch_size,
            config.model.max_forget_bits) == (None, False, 1.0, None, None)
    assert parse_args([*REQUIRED, "--no-lowercase"]).data.lowercase is False
    assert parse_args([*REQUIRED, "--rnn", "lstm", "--checkpoint-steps", "auto"]).execution.checkpoint_steps == "auto"
    assert parse_args([*REQUIRED, "--rnn", "gru", "--checkpoint-steps", "8"]).execution.checkpoint_steps == 8
    assert parse_args(REQUIRED).model.label_smoothing == 0.0


def test_subword_defaults_a_joint_vocabulary_of_8000_pieces():
    data = parse_args(REQUIRED).data
    assert (data.subword, data.spm_model) == ("none", ())
    data = parse_args([*REQUIRED, "--subword", "bpe"]).data
    assert (data.subword, data.vocab_size, data.joint_vocab, data.lowercase) == ("bpe", 8000, True, True)
    data = parse_args([*REQUIRED, "--subword", "unigram", "--vocab-size", "500", "--no-joint-vocab"]).data
    assert (data.subword, data.vocab_size, data.joint_vocab) == ("unigram", 500, False)
    assert parse_args([*REQUIRED, "--spm-model", "m"]).data.joint_vocab is True
    data = parse_args([*REQUIRED, "--spm-model", "en.model", "de.model"]).data
    assert (data.subword, data.spm_model, data.joint_vocab) == ("none", ("en.model", "de.model"), False)


def test_the_run_config_is_frozen_and_records_every_option_by_its_name():
    config = parse_args([*REQUIRED, "--hogwild", "2", "--epochs", "3"])
    with pytest.raises(FrozenInstanceError):
        config.training.epochs = 4  # library code cannot change what the user asked for
    options = config.options()
    assert options["hogwild"] == 2 and options["epochs"] == 3 and options["rnn"] == "revgru"
    assert options["save_dir"] == "runs/x" and "src_vocab" not in options
    json.dumps(options)  # config.json


def test_resuming_compares_the_run_defining_options():
    saved = parse_args([*REQUIRED, "--seed", "3"]).options()
    assert parse_args([*REQUIRED, "--seed", "3", "--log-every", "7"]).changes_from(saved) == []
    assert parse_args([*REQUIRED, "--seed", "4"]).changes_from(saved) == ["--seed 3 -> 4"]
    subwords = parse_args([*REQUIRED, "--seed", "3", "--subword", "bpe"])
    assert subwords.changes_from(saved) == ["--subword none -> bpe"]
    assert parse_args([*REQUIRED, "--seed", "3", "--spm-model", "m"]).changes_from(subwords.options()) == [
        "--subword bpe -> none", "--spm-model [] -> ['m']"]
    assert RunConfig.from_checkpoint(_checkpoint(subwords.options(), subwords.model)) == subwords


def test_a_checkpoint_from_before_an_option_existed_resumes_with_its_default():
    saved = parse_args(REQUIRED).options()
    for key in ("subword", "vocab_size", "joint_vocab", "spm_model"):
        del saved[key]
    assert parse_args(REQUIRED).changes_from(saved) == []
    assert parse_args([*REQUIRED, "--subword", "bpe"]).changes_from(saved) == ["--subword none -> bpe"]


def test_label_smoothing_reaches_the_model_and_fixes_the_run():
    config = parse_args([*REQUIRED, "--label-smoothing", "0.1"])
    assert config.model.label_smoothing == 0.1 and config.options()["label_smoothing"] == 0.1
    assert RunConfig.from_checkpoint(_checkpoint(config.options(), config.model)) == config
    # a model option: resuming with another value is refused, like --dropout
    assert parse_args(REQUIRED).changes_from(config.options()) == ["--label-smoothing 0.1 -> 0.0"]
    # checkpoints from before the option trained plain cross-entropy
    saved = parse_args(REQUIRED)
    args, model_config = saved.options(), saved.model.to_dict()
    del args["label_smoothing"], model_config["label_smoothing"]
    assert saved.changes_from(args) == []
    assert config.changes_from(args) == ["--label-smoothing 0.0 -> 0.1"]
    assert RunConfig.from_checkpoint(_checkpoint(args, ModelConfig(**model_config))) == saved


def test_encoder_and_embedding_options_reach_the_model_and_fix_the_run():
    options = ["--encoder", "bidirectional", "--tie-embeddings", "--share-embeddings"]
    config = parse_args([*REQUIRED, *options])
    assert config.model.bidirectional and config.model.tie_embeddings and config.model.share_embeddings
    assert RunConfig.from_checkpoint(_checkpoint(config.options(), config.model)) == config
    assert parse_args(REQUIRED).changes_from(config.options()) == [
        "--encoder bidirectional -> unidirectional", "--tie-embeddings True -> False",
        "--share-embeddings True -> False"]
    saved = parse_args(REQUIRED)  # a checkpoint from before the options: one direction, nothing tied
    args = {k: v for k, v in saved.options().items() if k not in ("encoder", "tie_embeddings", "share_embeddings")}
    assert saved.changes_from(args) == []
