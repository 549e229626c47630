import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trainer.data import (EOS, BatchSampler, DataError, default_prepared_dir, eval_batches, load_tokenizer, load_tokens,
                          prepare_dataset, unigram_entropy)
from trainer.data.prepare import _dtype_for
from trainer.contract import DatasetSpec
from trainer.contract.presets import DEMO_TEXT

REPO = Path(__file__).resolve().parents[2]
SLICE = 200_000  # characters: enough text for a 512-token BPE, fast to train


@pytest.fixture(scope="module")
def shakespeare() -> str:
    return DEMO_TEXT.read_text(encoding="utf-8")


@pytest.fixture
def text_file(tmp_path, shakespeare) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(shakespeare[:SLICE], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, shakespeare):
    folder = tmp_path_factory.mktemp("prepared")
    (folder / "corpus.txt").write_text(shakespeare[:SLICE], encoding="utf-8")
    return prepare_dataset(DatasetSpec(path=str(folder / "corpus.txt"), prepared_dir=str(folder / "out")), 512)


def spec(path, out="", **kw) -> DatasetSpec:
    return DatasetSpec(path=str(path), prepared_dir=str(out), **kw)


# ------------------------------------------------------------------ preparation


def test_it_writes_tokens_tokenizer_and_meta_that_decode_back_to_the_text(prepared, shakespeare):
    meta = json.loads((prepared.train_path.parent / "meta.json").read_text())
    assert meta == prepared.meta
    assert prepared.vocab_size <= 512 and prepared.dtype == "uint16"
    train, val = load_tokens(prepared.train_path), load_tokens(prepared.val_path)
    assert train.dtype == np.uint16 and len(train) == meta["train_tokens"] and len(val) == meta["val_tokens"]
    assert len(train) + len(val) == meta["tokens"]
    assert meta["val_tokens"] == math.ceil(meta["tokens"] * 0.05)
    assert int(np.concatenate([train, val]).max()) < prepared.vocab_size
    tok = load_tokenizer(prepared.tokenizer_path)
    # The split is a cut of one token stream: train then val decodes to exactly the source text.
    assert tok.decode(train) + tok.decode(val) == shakespeare[:SLICE]
    assert 1.5 < meta["bytes_per_token"] < 3.0


def test_it_round_trips_any_text_through_the_tokenizer(prepared):
    tok = load_tokenizer(prepared.tokenizer_path.parent)
    for text in ["ROMEO:\nWhat, ho!", "naïve café — 日本語 🎭", f"one{EOS}two", "  spaces\t\ttabs\n\n"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode(EOS) == [tok.eos_id] == [prepared.eos_id]


def test_it_reuses_prepared_files_when_source_and_vocab_are_unchanged(text_file, tmp_path):
    first = prepare_dataset(spec(text_file, tmp_path / "out"), 512)
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()}
    again = prepare_dataset(spec(text_file, tmp_path / "out"), 512)
    assert again.meta == first.meta
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "out").iterdir()} == stamps


def test_it_reuses_prepared_files_when_only_the_modification_time_changes(text_file, tmp_path):
    first = prepare_dataset(spec(text_file, tmp_path / "out"), 512)
    stamp = (tmp_path / "out" / "train.bin").stat().st_mtime_ns
    os.utime(text_file, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched, same bytes: hashed again, same hash
    again = prepare_dataset(spec(text_file, tmp_path / "out"), 512)
    assert again.meta["source_sha256"] == first.meta["source_sha256"]
    assert (tmp_path / "out" / "train.bin").stat().st_mtime_ns == stamp
    assert again.meta["source_stat"][0][2] == text_file.stat().st_mtime_ns


def test_it_prepares_again_when_the_source_text_changes(text_file, tmp_path):
    first = prepare_dataset(spec(text_file, tmp_path / "out"), 512)
    text_file.write_text(text_file.read_text() + "\nA new line of verse.\n")
    second = prepare_dataset(spec(text_file, tmp_path / "out"), 512)
    assert second.meta["source_sha256"] != first.meta["source_sha256"]
    assert second.meta["tokens"] > first.meta["tokens"]


def test_it_keeps_the_tokenizer_when_only_the_val_fraction_changes(text_file, tmp_path):
    first = prepare_dataset(spec(text_file, tmp_path / "out", val_fraction=0.05), 512)
    vocab = load_tokenizer(first.tokenizer_path)._tok.get_vocab()
    second = prepare_dataset(spec(text_file, tmp_path / "out", val_fraction=0.2), 512)
    assert second.meta["tokenizer_reused"] and second.meta["val_tokens"] > first.meta["val_tokens"]
    assert load_tokenizer(second.tokenizer_path)._tok.get_vocab() == vocab
    assert second.meta["tokens"] == first.meta["tokens"]


def test_it_uses_tokenizer_vocab_when_the_dataset_asks_for_fewer_tokens_than_the_model(text_file, tmp_path):
    data = prepare_dataset(spec(text_file, tmp_path / "out", tokenizer_vocab=300), 512)
    assert data.vocab_size <= 300 and data.meta["requested_vocab"] == 300


def test_it_joins_folder_files_in_sorted_order_with_the_eos_separator(tmp_path, shakespeare):
    folder = tmp_path / "books"
    (folder / "b").mkdir(parents=True)
    parts = {"b/2.txt": shakespeare[:30_000], "a.txt": shakespeare[30_000:60_000], "c.txt": shakespeare[60_000:90_000]}
    for name, text in parts.items():
        (folder / name).write_text(text)
    (folder / ".hidden").write_text("not data")
    data = prepare_dataset(spec(folder), 400)
    assert data.train_path.parent == default_prepared_dir(folder, 400) == tmp_path / "books.prepared" / "vocab-400"
    assert data.meta["source_files"] == ["a.txt", "b/2.txt", "c.txt"]
    ids = np.concatenate([load_tokens(data.train_path), load_tokens(data.val_path)])
    assert int((ids == data.eos_id).sum()) == 2
    tok = load_tokenizer(data.tokenizer_path)
    assert tok.decode(ids) == EOS.join(parts[n] for n in ["a.txt", "b/2.txt", "c.txt"])


def test_it_explains_what_to_change_for_bad_datasets(tmp_path, text_file):
    with pytest.raises(DataError, match="does not exist"):
        prepare_dataset(spec(tmp_path / "missing.txt"), 512)
    (tmp_path / "blank.txt").write_text(" \n\n ")
    with pytest.raises(DataError, match="no text"):
        prepare_dataset(spec(tmp_path / "blank.txt", tmp_path / "o1"), 512)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no files"):
        prepare_dataset(spec(tmp_path / "empty"), 512)
    with pytest.raises(DataError, match="at least 256 byte tokens .* 257 tokens; got 200: raise model.vocab_size"):
        prepare_dataset(spec(text_file, tmp_path / "o2"), 200)
    with pytest.raises(DataError, match="tokenizer_vocab=1024 is larger than model.vocab_size=512"):
        prepare_dataset(spec(text_file, tmp_path / "o3", tokenizer_vocab=1024), 512)
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1") * 100)
    with pytest.raises(DataError, match="not UTF-8"):
        prepare_dataset(spec(tmp_path / "latin1.txt", tmp_path / "o4"), 512)
    (tmp_path / "tiny.txt").write_text("a b")
    with pytest.raises(DataError, match="too few"):
        prepare_dataset(spec(tmp_path / "tiny.txt", tmp_path / "o5"), 512)


def test_it_prepares_once_when_every_rank_calls_at_the_same_time(text_file, tmp_path):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(prepare_dataset, [(spec(text_file, tmp_path / "out"), 512)] * 4)
    # One process built (its timings are in meta); the three others waited on the lock and read the same meta.
    assert all(r.meta == results[0].meta for r in results)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".lock", "meta.json", "tokenizer.json",
                                                                    "train.bin", "train.idx", "val.bin", "val.idx"]


def test_it_picks_the_narrowest_token_dtype():
    assert _dtype_for(512) == "uint16" and _dtype_for(65536) == "uint16"
    assert _dtype_for(65537) == "uint32" and _dtype_for(128_256) == "uint32"


def test_it_prepares_the_whole_tinyshakespeare_file_from_the_command_line(tmp_path):
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--path", str(DEMO_TEXT),
                           "--vocab", "2048", "--out", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - t0 < 60  # about 2 s here; the bound only catches a pathological slowdown
    assert "bytes/token" in done.stdout and "train.bin" in done.stdout
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["vocab_size"] == 2048 and meta["source_bytes"] == 1_115_394
    assert 2.5 < meta["bytes_per_token"] < 3.2
    assert 5.0 < unigram_entropy(load_tokens(tmp_path / "out" / "train.bin")) < math.log(2048)


def test_it_exits_with_a_message_on_the_command_line_for_a_missing_file(tmp_path):
    done = subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--path", str(tmp_path / "nope.txt"),
                           "--vocab", "512"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "does not exist" in done.stderr


# ------------------------------------------------------------------ sampling

TOKENS = np.arange(10_000, dtype=np.uint16)  # token value == position: a window shows where it came from


def step_sequences(dp: int, grad_accum: int, micro_batch: int, step: int, seed: int = 7) -> list[list[np.ndarray]]:
    """Per rank, the x rows of one step in micro-batch order."""
    ranks = []
    for rank in range(dp):
        sampler = BatchSampler(TOKENS, 16, micro_batch, grad_accum, dp_rank=rank, dp_size=dp, seed=seed)
        ranks.append([row for x, _ in sampler.micro_batches(step) for row in x])
    return ranks


def test_it_gives_int64_micro_batches_with_targets_shifted_by_one_token():
    batches = BatchSampler(TOKENS, 16, micro_batch=3, grad_accum=2, seed=1).micro_batches(0)
    assert len(batches) == 2
    for x, y in batches:
        assert x.shape == y.shape == (3, 16) and x.dtype == y.dtype == np.int64
        assert np.array_equal(y[:, :-1], x[:, 1:])
        assert np.array_equal(x, x[:, :1] + np.arange(16))  # contiguous windows of the token stream


def test_it_draws_the_same_batches_from_seed_and_step_alone():
    a = BatchSampler(TOKENS, 16, 4, 2, seed=3)
    b = BatchSampler(TOKENS, 16, 4, 2, seed=3)
    for _ in range(5):
        a.micro_batches(0)  # a straight run has been through other steps; a resumed one starts at step 9
    for (xa, ya), (xb, yb) in zip(a.micro_batches(9), b.micro_batches(9)):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert not np.array_equal(a.micro_batches(9)[0][0], a.micro_batches(10)[0][0])
    assert not np.array_equal(a.micro_batches(9)[0][0], BatchSampler(TOKENS, 16, 4, 2, seed=4).micro_batches(9)[0][0])


def test_it_draws_the_same_offsets_in_another_process():
    code = ("import numpy as np; from trainer.data import BatchSampler; "
            "tokens = np.arange(10_000, dtype=np.uint16); "
            "print(BatchSampler(tokens, 16, 4, 2, 1, 2, seed=11).global_offsets(3).tolist())")
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    here = BatchSampler(TOKENS, 16, 4, 2, dp_rank=0, dp_size=2, seed=11).global_offsets(3).tolist()
    assert json.loads(done.stdout) == here


def test_it_splits_the_same_global_batch_over_any_number_of_data_parallel_ranks():
    for step in (0, 1, 17):
        dp1 = step_sequences(dp=1, grad_accum=8, micro_batch=2, step=step)
        for dp, grad_accum in ((2, 4), (4, 2), (8, 1)):
            split = step_sequences(dp=dp, grad_accum=grad_accum, micro_batch=2, step=step)
            # Same sequences in the same global order: rank r holds the r-th slice of the dp=1 batch.
            assert all(np.array_equal(a, b) for a, b in zip(dp1[0], [row for rank in split for row in rank]))
        # A different micro-batch size over the same global batch is the same step too.
        assert all(np.array_equal(a, b) for a, b in zip(dp1[0], step_sequences(1, 4, 4, step)[0]))


def test_it_gives_each_rank_a_disjoint_share_of_the_step():
    ranks = step_sequences(dp=4, grad_accum=3, micro_batch=2, step=5)
    starts = [{int(row[0]) for row in rank} for rank in ranks]
    assert all(len(s) == 6 for s in starts)
    assert len(set().union(*starts)) == 24  # distinct offsets, none shared between ranks


def test_it_refuses_a_step_larger_than_the_data():
    with pytest.raises(DataError, match="a training step needs 64 distinct windows"):
        BatchSampler(np.arange(50, dtype=np.uint16), 16, micro_batch=8, grad_accum=4, dp_size=2)
    with pytest.raises(DataError, match="dp_rank=2"):
        BatchSampler(TOKENS, 16, 1, 1, dp_rank=2, dp_size=2)


def test_it_gives_fixed_evaluation_batches():
    a = eval_batches(TOKENS, 16, batch_size=4, n_batches=3, seed=1)
    b = eval_batches(TOKENS, 16, batch_size=4, n_batches=3, seed=1)
    assert len(a) == 3 and all(x.shape == (4, 16) for x, _ in a)
    assert all(np.array_equal(xa, xb) and np.array_equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))
    assert all(np.array_equal(y[:, :-1], x[:, 1:]) for x, y in a)


def test_it_samples_real_prepared_tokens_within_the_vocabulary(prepared):
    train = load_tokens(prepared.train_path)
    x, y = BatchSampler(train, 64, 4, 1, seed=0).micro_batches(0)[0]
    assert x.max() < prepared.vocab_size and y.min() >= 0
    val = load_tokens(prepared.val_path)
    assert len(eval_batches(val, 64, 4, 2, seed=0)) == 2


# ------------------------------------------------------------------ entropy


def test_it_measures_unigram_entropy_in_nats():
    assert unigram_entropy(np.array([5, 5, 5])) == 0.0
    assert unigram_entropy(np.arange(256, dtype=np.uint16)) == pytest.approx(math.log(256))
    assert unigram_entropy(np.array([0, 0, 0, 1])) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
