"""Preparation that scales: a corpus cut into shards (byte ranges of plain files, row groups of Parquet), encoded by
worker processes, kept shard by shard across a crash, and joined into the ids one process reading in order gives."""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from trainer.contract import DatasetSpec
from trainer.contract.presets import demo_text
from trainer.data import load_tokens, prepare_dataset
from trainer.data import prepare as prepare_module
from trainer.data.encode import encode_all, plan_shards
from trainer.data.tokenizer import load_tokenizer, train_tokenizer

VOCAB = 512


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A JSONL file with bad rows here and there, and a text file, both large enough to cut into many shards."""
    root = tmp_path_factory.mktemp("corpus")
    text = demo_text(300_000).decode()
    docs = [p for p in text.split("\n\n") if p.strip()]
    lines = []
    for i, d in enumerate(docs):
        lines.append(b"{broken" if i % 97 == 13 else json.dumps({"text": d}).encode())
    (root / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (root / "b.txt").write_text(text)
    train_tokenizer(iter(docs), VOCAB).save(str(root / "tokenizer.json"))
    return root


def encode(corpus, tmp_path, shard_bytes: int, workers: int):
    units = [("a.jsonl", corpus / "a.jsonl"), ("b.txt", corpus / "b.txt")]
    shards = plan_shards(units, shard_bytes)
    folder = tmp_path / f"work-{shard_bytes}"
    folder.mkdir()
    tok = load_tokenizer(corpus / "tokenizer.json")
    with open(tmp_path / f"ids-{shard_bytes}.bin", "wb") as f:
        encoded = encode_all(shards, corpus / "tokenizer.json", "uint16", "text", folder, f, tok.eos_id, workers)
    return shards, encoded, np.fromfile(tmp_path / f"ids-{shard_bytes}.bin", dtype=np.uint16)


def test_shards_read_by_byte_ranges_in_two_processes_give_the_ids_and_report_of_one_pass(corpus, tmp_path):
    one_shards, one, one_ids = encode(corpus, tmp_path, 1 << 30, workers=1)
    many_shards, many, many_ids = encode(corpus, tmp_path, 16 << 10, workers=2)
    assert len(one_shards) == 2 and len(many_shards) > 20
    assert many_ids.tolist() == one_ids.tolist()
    assert many.lengths.tolist() == one.lengths.tolist() and many.lengths.sum() == len(many_ids)
    assert many.report.to_dict() == one.report.to_dict()
    # the bad rows are named by their line in the file, whichever shard found them
    assert many.report.first[:2] == ["a.jsonl:14: not JSON (Expecting property name enclosed in double quotes: "
                                     "line 1 column 2 (char 1))", "a.jsonl:111: not JSON (Expecting property name "
                                     "enclosed in double quotes: line 1 column 2 (char 1))"]
    # the text file is one document however many shards read it
    assert len(many.lengths) == one.report.rows - one.report.bad + 1


def test_a_preparation_started_again_after_a_crash_keeps_the_shards_it_finished(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "plan_shards", functools.partial(plan_shards, shard_bytes=32 << 10))
    spec = DatasetSpec(path=str(corpus / "a.jsonl"), prepared_dir=str(tmp_path / "out"),
                       tokenizer=str(corpus / "tokenizer.json"), max_bad_fraction=0.05)
    seen = []

    def crash_after_three(done: int, total: int) -> None:
        seen.append((done, total))
        if done == 3:
            raise KeyboardInterrupt  # what a kill would leave: three shards on disk, no meta.json

    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(spec, VOCAB, workers=1, progress=crash_after_three)
    assert not (tmp_path / "out" / "meta.json").exists()
    again = []
    data = prepare_dataset(spec, VOCAB, workers=1, progress=lambda done, total: again.append((done, total)))
    total = seen[0][1]
    assert again[0] == (3, total) and again[-1] == (total, total)  # the three finished shards were kept
    fresh = prepare_dataset(spec.replace(prepared_dir=str(tmp_path / "fresh")), VOCAB, workers=1)
    assert load_tokens(data.train_path).tolist() == load_tokens(fresh.train_path).tolist()
    assert data.meta["bad_rows"] == fresh.meta["bad_rows"]
    assert not (tmp_path / "out" / ".shards").exists()  # gone once the files hold them
