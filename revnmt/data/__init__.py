"""Data pipeline: raw parallel text -> Moses tokens or SentencePiece pieces -> vocabulary ids -> padded batches."""

from revnmt.data.batching import Batch, BatchSampler, EncodedDataset, Example, make_batch, sorted_batches
from revnmt.data.corpus import ParallelCorpus, decode_lines, decode_stream, language_file, load_parallel, read_lines
from revnmt.data.loading import DataConfig, DataOptions, TrainingData, load_data, prepared_options, text_options
from revnmt.data.multi30k import MULTI30K_SPLITS, find_multi30k, multi30k_prefix
from revnmt.data.subword import (
    DEFAULT_VOCAB_SIZE,
    SUBWORD_TYPES,
    SubwordTokenizer,
    read_subword_model,
    train_subword_model,
)
from revnmt.data.tokenization import Detokenizer, SentenceDetokenizer, SentenceTokenizer, Tokenizer
from revnmt.data.vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocabulary

__all__ = [
    "BOS",
    "DEFAULT_VOCAB_SIZE",
    "EOS",
    "MULTI30K_SPLITS",
    "PAD",
    "SPECIALS",
    "SUBWORD_TYPES",
    "UNK",
    "Batch",
    "DataConfig",
    "DataOptions",
    "BatchSampler",
    "Detokenizer",
    "EncodedDataset",
    "Example",
    "ParallelCorpus",
    "SentenceDetokenizer",
    "SentenceTokenizer",
    "SubwordTokenizer",
    "TrainingData",
    "Tokenizer",
    "Vocabulary",
    "find_multi30k",
    "language_file",
    "load_data",
    "load_parallel",
    "make_batch",
    "multi30k_prefix",
    "prepared_options",
    "read_lines",
    "read_subword_model",
    "decode_lines",
    "decode_stream",
    "sorted_batches",
    "text_options",
    "train_subword_model",
]
