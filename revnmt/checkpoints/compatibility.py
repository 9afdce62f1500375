"""Whether checkpoints can be combined. An ensemble needs members that read and write text alike: the same
vocabularies and the same tokenization (languages, casing, SentencePiece models). Averaging weights needs
the same architecture as well, down to every weight's shape.

Each function compares two checkpoints (:class:`revnmt.checkpoints.Checkpoint`) and lists their differences in
words, for a message that names both files.
"""

from __future__ import annotations

from revnmt.checkpoints.record import Checkpoint

# Model options that change how a model trains or computes, not the function its weights define: the
# runs of checkpoints that differ only in these may be averaged (a resumed run may change the first two).
_NOT_ARCHITECTURE = ("buffer_backend", "checkpoint_steps", "buffer_lanes", "buffer_tile", "decoder_chunk_steps",
                     "sweep_kernels", "logit_block", "dropout")
# Data options that do not change how text becomes tokens: only the length of training pairs and the
# default truncation of inputs.
_NOT_TOKENIZATION = ("max_len",)


def text_differences(a: Checkpoint, b: Checkpoint) -> list[str]:
    """How two checkpoints differ in their vocabularies or tokenization (empty if they do not)."""
    differences = [f"their {side} vocabularies differ ({_first_difference(vocab_a, vocab_b)})"
                   for side, vocab_a, vocab_b in (("source", a.src_vocab, b.src_vocab),
                                                  ("target", a.tgt_vocab, b.tgt_vocab)) if vocab_a != vocab_b]
    data_a, data_b = a.data.to_dict(), b.data.to_dict()
    for key in sorted((data_a.keys() | data_b.keys()) - set(_NOT_TOKENIZATION)):
        value_a, value_b = data_a.get(key), data_b.get(key)
        if value_a == value_b:
            continue
        if key.endswith("_spm"):  # model bytes: say what differs, not what they hold
            kinds = ["SentencePiece" if value is not None else "Moses words" for value in (value_a, value_b)]
            what = "different models" if kinds[0] == kinds[1] else " and ".join(kinds)
            differences.append(f"their {'source' if key == 'src_spm' else 'target'} tokenization differs ({what})")
        else:
            differences.append(f"--{key} {value_a} and {value_b}")
    return differences


def _first_difference(a: list[str], b: list[str]) -> str:
    """Where two different vocabularies differ: in size, else at their first different entry."""
    if len(a) != len(b):
        return f"{len(a)} and {len(b)} entries"
    index = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    return f"entry {index} is {a[index]!r} and {b[index]!r}"


def architecture_differences(a: Checkpoint, b: Checkpoint) -> list[str]:
    """How two checkpoints differ in their model's architecture (empty if they do not). The vocabularies'
    sizes are left to :func:`text_differences`; the weights' names and shapes are compared too, where the
    options agree, so that nothing an option does not show goes unseen."""
    config_a, config_b = a.model_config.to_dict(), b.model_config.to_dict()
    ignored = {*_NOT_ARCHITECTURE, "src_vocab", "tgt_vocab"}
    differences = [f"--{key.replace('_', '-')} {config_a.get(key)} and {config_b.get(key)}"
                   for key in sorted((config_a.keys() | config_b.keys()) - ignored)
                   if config_a.get(key) != config_b.get(key)]
    if differences:
        return differences
    weights_a, weights_b = a.weights, b.weights
    if weights_a.keys() != weights_b.keys():
        return [f"their weights differ in name ({', '.join(sorted(weights_a.keys() ^ weights_b.keys()))})"]
    return [f"{key} is {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} {y.dtype}"
            for key, x, y in ((key, weights_a[key], weights_b[key]) for key in weights_a)
            if x.shape != y.shape or x.dtype != y.dtype]
