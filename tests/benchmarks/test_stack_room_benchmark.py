"""benchmarks/stack_room.py: every stack of a model gets a room of its own and learns it from its sweeps."""

import torch
from benchmark_scripts import load_script

from revnmt.memory.budget import synthetic_batch
from revnmt.model import ExecutionConfig, ModelConfig, build_model

room = load_script("stack_room")


def test_each_stack_reruns_its_first_sweep_only_and_holds_its_heights():
    torch.manual_seed(0)
    model = build_model(ModelConfig(rnn="revlstm", emb_dim=8, hidden_size=12, encoder="bidirectional", slice_dim=3,
                                    src_vocab=20, tgt_vocab=20), ExecutionConfig(buffer_lanes=1)).train()
    batches = [synthetic_batch(4, 40, 20, 20, torch.device("cpu"), seed) for seed in range(4)]
    figures = room.measure(model, batches, margin=1.0)
    assert list(figures) == ["encoder.forward", "encoder.backward", "decoder"]
    for stack in figures.values():
        assert stack["sweeps"] == 4 and stack["reruns"] == 1  # the first, which starts from no room
        assert stack["room_over_height"] >= 1  # the room held every later sweep
    assert all(rnn.stack_room.margin == 1.0 for rnn in room.stacks(model).values())
