"""How fast a corpus is prepared, against how fast its tokenizer can go: ``python -m bench.trainer.data``.

    python -m bench.trainer.data [--sizes-gb 0.25,1] [--workers 2] [--vocab 16384] [--work-dir DIR] [--json FILE]

For each size it writes a JSONL corpus of Shakespeare's speeches (each document a few speeches in a random order,
so that documents differ) and prepares it with ``--workers`` processes through the command line
(``python -m trainer.data prepare``, a given tokenizer: the encoding is measured, not the tokenizer's training).
Beside it, the ceiling on this machine: the tokenizer's own ``encode_batch`` on the same documents, already in
memory, in one process on one thread. It prints tokens/s of each, the preparation's tokens/s per worker against the
ceiling (target ≥ 0.8), and the preparation's peak memory, all its processes together (target ≤ 1 GB whatever the
size).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainer.contract.presets import demo_text

CEILING_SAMPLE_BYTES = 64 << 20   # documents the ceiling is measured on
TARGET_RATIO, TARGET_PEAK_BYTES = 0.8, 1e9


def speeches() -> list[str]:
    return [p for p in demo_text().decode().split("\n\n") if p.strip()]


def write_corpus(path: Path, size_bytes: int, seed: int = 0) -> int:
    """A JSONL file of about ``size_bytes``: documents of 1 to 8 speeches; the number of documents."""
    rng = random.Random(seed)
    parts = speeches()
    written = count = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            line = json.dumps({"text": "\n\n".join(rng.sample(parts, rng.randint(1, 8)))}) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
            count += 1
    return count


def ceiling_tokens_per_s(tokenizer: Path, corpus: Path) -> float:
    """encode_batch on the corpus's first documents (in memory), one thread, in a fresh process."""
    code = ("import json, sys, time\n"
            "from tokenizers import Tokenizer\n"
            "tok = Tokenizer.from_file(sys.argv[1])\n"
            "docs, size = [], 0\n"
            "for line in open(sys.argv[2], encoding='utf-8'):\n"
            "    docs.append(json.loads(line)['text']); size += len(line)\n"
            "    if size >= int(sys.argv[3]): break\n"
            "t0, n = time.perf_counter(), 0\n"
            "for i in range(0, len(docs), 64):\n"
            "    n += sum(len(e.ids) for e in tok.encode_batch(docs[i:i + 64]))\n"
            "print(n / (time.perf_counter() - t0))\n")
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, "-c", code, str(tokenizer), str(corpus), str(CEILING_SAMPLE_BYTES)],
                          capture_output=True, text=True, env=env, check=True)
    return float(done.stdout.strip())


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def prepare(corpus: Path, tokenizer: Path, vocab: int, workers: int, out: Path) -> dict:
    """The command-line preparation, timed, its peak memory sampled over its whole process tree."""
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "trainer.data", "prepare", "--path", str(corpus), "--vocab", str(vocab),
               "--tokenizer", str(tokenizer), "--out", str(out), "--workers", str(workers), "--json"]
    t0 = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]

    def sample() -> None:
        while process.poll() is None:
            peak[0] = max(peak[0], _tree_rss(process.pid))
            time.sleep(0.1)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    seconds = time.perf_counter() - t0
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"preparation failed ({process.returncode}): {stderr[-2000:]}")
    meta = json.loads(stdout)
    return {"tokens": meta["tokens"], "seconds": seconds, "peak_bytes": peak[0], "documents": meta["documents"]}


def run(sizes_gb: list[float], workers: int, vocab: int, work_dir: Path) -> list[dict]:
    from trainer.data.tokenizer import train_tokenizer
    tokenizer = work_dir / "tokenizer.json"
    train_tokenizer(iter(speeches()), vocab).save(str(tokenizer))
    rows = []
    for size in sizes_gb:
        corpus = work_dir / f"corpus-{size:g}gb.jsonl"
        write_corpus(corpus, int(size * 1e9))
        ceiling = ceiling_tokens_per_s(tokenizer, corpus)
        got = prepare(corpus, tokenizer, vocab, workers, work_dir / f"prepared-{size:g}gb")
        per_worker = got["tokens"] / got["seconds"] / workers
        rows.append({"size_gb": size, "bytes": corpus.stat().st_size, "workers": workers, **got,
                     "tokens_per_s": got["tokens"] / got["seconds"], "tokens_per_s_per_worker": per_worker,
                     "ceiling_tokens_per_s": ceiling, "ratio": per_worker / ceiling})
        corpus.unlink()
    return rows


def render(rows: list[dict]) -> str:
    head = (f"{'corpus':>8} {'documents':>10} {'tokens':>13} {'seconds':>8} {'tokens/s':>11} {'per worker':>11} "
            f"{'ceiling':>11} {'ratio':>6} {'peak MB':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['size_gb']:>6g}GB {r['documents']:>10,} {r['tokens']:>13,} {r['seconds']:>8.1f} "
                     f"{r['tokens_per_s']:>11,.0f} {r['tokens_per_s_per_worker']:>11,.0f} "
                     f"{r['ceiling_tokens_per_s']:>11,.0f} {r['ratio']:>6.2f} {r['peak_bytes'] / 1e6:>8.0f}")
    lines += ["", f"targets: per worker ≥ {TARGET_RATIO} × the ceiling (encode_batch, one thread, text in memory); "
                  f"peak ≤ {TARGET_PEAK_BYTES / 1e9:.2f} GB (all the preparation's processes)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-gb", default="0.25,1", help="corpus sizes, comma-separated")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--work-dir", default="", help="where the corpora go (default: a temporary folder)")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes_gb.split(",") if s.strip()]
    if args.work_dir:
        Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work_dir or None) as tmp:
        rows = run(sizes, args.workers, args.vocab, Path(tmp))
    print(render(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
