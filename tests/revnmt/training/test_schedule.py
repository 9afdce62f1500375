import functools
import subprocess
import sys

import pytest
import torch
from conftest import TINY_MODEL

from revnmt.training.config import TrainingConfig
from revnmt.training.schedule import build_optimizer, build_scheduler


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50))


def _train(optimizer_of, steps: int = 5) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model(0)
    optimizer = optimizer_of(model.parameters())
    ids = torch.randint(50, (4, 6), generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        optimizer.step()
    return model, optimizer


@pytest.mark.parametrize(("name", "torch_class", "lr"),
                         [("adam", functools.partial(torch.optim.Adam, fused=True), 1e-2),
                          ("sgd", torch.optim.SGD, 0.5)])
def test_optimizers_update_and_save_as_torchs_do(name, torch_class, lr, tmp_path):
    config = TrainingConfig(save_dir=str(tmp_path), optimizer=name, lr=lr)
    ours, our_optimizer = _train(lambda params: build_optimizer(config, params))
    theirs, their_optimizer = _train(lambda params: torch_class(params, lr=lr))
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)  # bit for bit
    saved = our_optimizer.state_dict()
    assert str(saved) == str(their_optimizer.state_dict())
    # A checkpoint of either loads into the other and goes on the same.
    their_optimizer.load_state_dict(saved)
    our_optimizer.load_state_dict(their_optimizer.state_dict())
    build_scheduler(config, our_optimizer).step(1.0)


def test_a_run_imports_no_compiler_stack(toy, tmp_path):
    # torch's own optimizers import torch._dynamo (and with it torch._inductor, sympy, triton) on first use.
    # A run that trains, validates, saves, resumes and tests, in a process of its own:
    code = f"""
import sys
from revnmt.cli.train import main
for steps in ("3", "5"):
    assert main({["--train", toy["train"], "--valid", toy["valid"], "--test", toy["test"], "--save-dir",
                  str(tmp_path / "run"), *TINY_MODEL, "--batch-size", "32", "--save-every", "1"]!r}
                + ["--max-steps", steps]) == 0
print("torch._dynamo" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
