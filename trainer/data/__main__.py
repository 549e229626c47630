"""python -m trainer.data prepare --path TEXT --vocab N [--out DIR] [--val-fraction F]"""
from __future__ import annotations

import argparse
import sys
import time

from trainer.contract import DatasetSpec
from trainer.data.errors import DataError
from trainer.data.prepare import prepare_dataset
from trainer.data.sampler import unigram_entropy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.data", description="Text → token ids on disk.")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="train a tokenizer and write train.bin / val.bin")
    prep.add_argument("--path", required=True, help="a text file or a folder of text files")
    prep.add_argument("--vocab", type=int, required=True, help="tokenizer vocabulary size")
    prep.add_argument("--out", default="", help="prepared folder (default: <path>.prepared/vocab-<N>)")
    prep.add_argument("--val-fraction", type=float, default=0.05)
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    try:
        data = prepare_dataset(DatasetSpec(path=args.path, prepared_dir=args.out, val_fraction=args.val_fraction),
                               args.vocab)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    m = data.meta
    print(f"prepared {m['source']} ({len(m['source_files'])} file(s), {m['source_bytes']:,} bytes) "
          f"in {time.perf_counter() - t0:.2f} s")
    print(f"  tokenizer  {data.tokenizer_path}  vocab {m['vocab_size']} (asked {m['requested_vocab']}), "
          f"trained in {m['tokenizer_train_s']:.2f} s")
    print(f"  train.bin  {data.train_path}  {m['train_tokens']:,} tokens ({m['dtype']})")
    print(f"  val.bin    {data.val_path}  {m['val_tokens']:,} tokens")
    print(f"  {m['bytes_per_token']:.3f} bytes/token; unigram entropy "
          f"{unigram_entropy(data.train_tokens()):.3f} nats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
