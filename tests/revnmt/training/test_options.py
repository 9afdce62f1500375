import pytest
import torch

from revnmt.training.options import parse_args

REQUIRED = ["--save-dir", "runs/x"]


@pytest.mark.parametrize("options, message", [
    (["--rnn", "rnn"], "invalid choice: 'rnn'"),
    (["--hidden-size", "15"], "--hidden-size must be even"),
    (["--slice-dim", "200"], "--slice-dim must be in [1, hidden_size/2 = 150]"),
    (["--max-forget-bits", "4"], "--max-forget-bits must be one of 1, 2, 3, 5 or none"),
    (["--dropout", "1.0"], "--dropout must be in [0, 1)"),
    (["--emb-dim", "0"], "emb_dim must be positive"),
    (["--train", "data/train"], "--train and --valid go together"),
    (["--data", "multi30k", "--train", "a", "--valid", "b"], "not both"),
    (["--batch-size", "0"], "must be a positive integer"),
    (["--lr", "-1"], "must be positive"),
    (["--lr-decay", "1.5"], "--lr-decay must be in (0, 1)"),
    (["--clip", "-1"], "--clip must be >= 0"),
    (["--lr", "1e-6"], "--lr 1e-06 is below --min-lr 1e-05"),
    (["--device", "gpu0"], "is not a torch device"),
    (["--buffer-backend", "cudnn"], "invalid choice: 'cudnn'"),
    (["--buffer-backend", "numba", "--device", "meta"], "--buffer-backend: the numba buffer backend runs on CPU only"),
])
def test_bad_options_are_usage_errors(options, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*REQUIRED, *options])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "train.py: error: " in err and message in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_a_gpu_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse_args([*REQUIRED, "--device", "cuda"])
    assert "no CUDA device" in capsys.readouterr().err


def test_defaults_depend_on_data_and_optimizer():
    args = parse_args(REQUIRED)
    assert (args.data, args.lowercase, args.optimizer, args.lr, args.batch_size) == ("multi30k", True, "adam", 1e-3, 64)
    assert (args.rnn, args.attention, args.slice_dim, args.max_forget_bits) == ("revgru", "emb+slice", 20, 3)
    args = parse_args([*REQUIRED, "--train", "t", "--valid", "v", "--optimizer", "sgd", "--batch-tokens", "2000",
                       "--max-forget-bits", "none"])
    assert (args.data, args.lowercase, args.lr, args.batch_size, args.max_forget_bits) == (None, False, 1.0, None, None)
    assert parse_args([*REQUIRED, "--no-lowercase"]).lowercase is False
