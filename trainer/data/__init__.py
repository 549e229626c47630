"""Text → token ids on disk → batches for every rank.

    tokenizer   byte-level BPE: load_tokenizer, TextTokenizer (what generation and deployment read)
    prepare     prepare_dataset: a text file or folder → tokenizer.json, train.bin, val.bin, meta.json
    sampler     BatchSampler (training windows per rank), eval_batches, validation_batches, unigram_entropy
    corpus/     the demo text that ships with the project (trainer.contract.presets.DEMO_TEXT)

    python -m trainer.data prepare --path TEXT --vocab N
"""
from trainer.data.errors import DataError
from trainer.data.prepare import PreparedData, default_prepared_dir, load_tokens, prepare_dataset
from trainer.data.sampler import BatchSampler, eval_batches, unigram_entropy, validation_batches
from trainer.data.tokenizer import EOS, TextTokenizer, load_tokenizer

__all__ = ["DataError", "PreparedData", "prepare_dataset", "load_tokens", "load_tokenizer", "TextTokenizer",
           "BatchSampler", "eval_batches", "validation_batches", "unigram_entropy", "default_prepared_dir", "EOS"]
