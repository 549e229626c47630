"""python -m trainer.data prepare --path DATA --vocab N [--out DIR] [--val-fraction F] [--text-field NAME]
    [--tokenizer PATH] [--max-bad-fraction F] [--workers N] [--json]"""
from __future__ import annotations

import argparse
import json
import sys
import time

from trainer.contract import DatasetSpec
from trainer.data.errors import DataError
from trainer.data.prepare import prepare_dataset
from trainer.data.sampler import unigram_entropy
from trainer.data.sources import BadRowsError


def _progress(done: int, shards: int) -> None:
    if shards > 1:
        print(f"encoded {done} of {shards} shards", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.data", description="Text → token ids on disk.")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="tokenize a corpus into train.bin / val.bin (with Megatron's .idx)")
    prep.add_argument("--path", required=True, help="a text, JSONL (.gz, .zst), Parquet or Megatron .bin file, or a "
                                                    "folder of them")
    prep.add_argument("--vocab", type=int, required=True, help="the model's vocabulary size (a new tokenizer's too)")
    prep.add_argument("--out", default="", help="prepared folder (default: <path>.prepared/vocab-<N>)")
    prep.add_argument("--val-fraction", type=float, default=0.05)
    prep.add_argument("--text-field", default="text", help="the JSONL key or Parquet column of the text")
    prep.add_argument("--tokenizer", default="", help="an existing tokenizer: tokenizer.json, or a folder with one or "
                                                      "with GPT-2's vocab.json and merges.txt")
    prep.add_argument("--max-bad-fraction", type=float, default=0.01,
                      help="share of unreadable rows skipped before the source is refused")
    prep.add_argument("--workers", type=int, default=0, help="processes that encode (default: one a CPU this process may use)")
    prep.add_argument("--json", action="store_true", help="print the preparation's meta.json (or the refusal) as JSON")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    spec = DatasetSpec(path=args.path, prepared_dir=args.out, val_fraction=args.val_fraction,
                       text_field=args.text_field, tokenizer=args.tokenizer, max_bad_fraction=args.max_bad_fraction)
    problems = spec.problems()
    if problems:
        print("error: " + "; ".join(m for ms in problems.values() for m in ms), file=sys.stderr)
        return 2
    try:
        data = prepare_dataset(spec, args.vocab, workers=args.workers or None, progress=_progress)
    except BadRowsError as exc:
        print(json.dumps({"refused": str(exc), "bad_rows": exc.report.to_dict()}) if args.json else f"error: {exc}",
              file=sys.stdout if args.json else sys.stderr)
        return 2
    except DataError as exc:
        print(json.dumps({"refused": str(exc)}) if args.json else f"error: {exc}",
              file=sys.stdout if args.json else sys.stderr)
        return 2
    m = data.meta
    if args.json:
        print(json.dumps(m))
        return 0
    print(f"prepared {m['source']} ({len(m['source_files'])} file(s), {', '.join(m['source_kinds'])}, "
          f"{m['documents']:,} documents, {m['source_bytes']:,} bytes) in {time.perf_counter() - t0:.2f} s")
    bad = m["bad_rows"]
    if bad["bad"]:
        print(f"  skipped {bad['bad']:,} of {bad['rows']:,} rows: " + "; ".join(bad["first"]))
    how = "given" if m.get("tokenizer_source") else f"trained in {m['tokenizer_train_s']:.2f} s"
    print(f"  tokenizer  {data.tokenizer_path}  vocab {m['vocab_size']} (asked {m['requested_vocab']}), {how}")
    print(f"  train.bin  {data.train_path}  {m['train_tokens']:,} tokens ({m['dtype']}; train.idx beside it)")
    print(f"  val.bin    {data.val_path}  {m['val_tokens']:,} tokens")
    if m["source_bytes"]:
        print(f"  {m['bytes_per_token']:.3f} bytes/token; unigram entropy "
              f"{unigram_entropy(data.train_tokens()):.3f} nats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
