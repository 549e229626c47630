"""Corpora as teams have them: JSONL (plain, gzip, zstd) and Parquet with a text field, Megatron-LM's indexed
data, and an existing tokenizer. Bad rows are counted and located, too many refuse the source, and each kind trains
a tiny model."""
from __future__ import annotations

import gzip
import json
import math
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import ByteLevelBPETokenizer

from tests.trainer.launch import launch, losses, tiny_spec
from trainer.contract import DatasetSpec
from trainer.contract.presets import demo_text
from trainer.data import DataError, load_tokenizer, load_tokens, prepare_dataset
from trainer.data.indexed import read_index
from trainer.data.sources import BadRowsError
from trainer.data.tokenizer import train_tokenizer

VOCAB = 512


@pytest.fixture(scope="module")
def docs() -> list[str]:
    """Shakespeare's speeches, one document each."""
    return [p for p in demo_text(200_000).decode().split("\n\n") if p.strip()]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, docs):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer(iter(docs), VOCAB).save(str(path))
    return path


def joined_ids(tok, texts: list[str]) -> list[int]:
    """What preparation must give: each document's ids, the end-of-text id between two documents."""
    out: list[int] = []
    for i, text in enumerate(texts):
        out += ([tok.eos_id] if i else []) + tok.encode(text)
    return out


def prepared_ids(data) -> list[int]:
    return np.concatenate([load_tokens(data.train_path), load_tokens(data.val_path)]).tolist()


def write_jsonl(path, rows: list[bytes]) -> None:
    raw = b"\n".join(rows) + b"\n"
    if path.name.endswith(".gz"):
        raw = gzip.compress(raw)
    elif path.name.endswith(".zst"):
        raw = zstandard.ZstdCompressor().compress(raw)
    path.write_bytes(raw)


BAD_ROWS = {3: b'{"text": "cut', 5: b'{"body": "no text field"}', 7: b'{"text": 5}', 9: b'{"text": "caf\xe9"}'}


@pytest.mark.parametrize("name", ["chat.jsonl", "chat.jsonl.gz", "chat.jsonl.zst"])
def test_a_jsonl_source_skips_and_reports_its_bad_rows_and_encodes_the_rest_as_documents(tmp_path, docs, tokenizer,
                                                                                        name):
    good = docs[:300]
    rows, kept = [], iter(good)
    for line in range(1, len(good) + len(BAD_ROWS) + 1):
        rows.append(BAD_ROWS.get(line) or json.dumps({"text": next(kept), "id": line}).encode())
    write_jsonl(tmp_path / name, rows)
    spec = DatasetSpec(path=str(tmp_path / name), prepared_dir=str(tmp_path / "out"), tokenizer=str(tokenizer),
                       max_bad_fraction=0.02)
    data = prepare_dataset(spec, VOCAB)
    assert data.meta["bad_rows"]["rows"] == len(rows) and data.meta["bad_rows"]["bad"] == 4
    first = data.meta["bad_rows"]["first"]
    assert first[0].startswith(f"{name}:3: not JSON (") and first[1] == f"{name}:5: no field 'text'"
    assert first[2] == f"{name}:7: field 'text' holds int, not text" and first[3].startswith(f"{name}:9: not UTF-8")
    assert data.meta["documents"] == len(good) and data.meta["source_kinds"] == ["jsonl"]
    assert prepared_ids(data) == joined_ids(load_tokenizer(tokenizer), good)


def test_a_source_with_more_bad_rows_than_allowed_is_refused_with_the_report_and_nothing_published(tmp_path, docs):
    rows = [json.dumps({"text": d}).encode() for d in docs[:50]] + [b"not json"] * 2
    write_jsonl(tmp_path / "data.jsonl", rows)
    spec = DatasetSpec(path=str(tmp_path / "data.jsonl"), prepared_dir=str(tmp_path / "out"))  # 1 % allowed
    with pytest.raises(BadRowsError, match=r"2 of 52 rows could not be read.*data.jsonl:51: not JSON") as refused:
        prepare_dataset(spec, VOCAB)
    assert refused.value.report.to_dict()["bad"] == 2
    assert not (tmp_path / "out" / "meta.json").exists() and not (tmp_path / "out" / "train.bin").exists()
    # the field named in the spec is the one read: another name finds no row
    write_jsonl(tmp_path / "other.jsonl", [json.dumps({"content": d}).encode() for d in docs[:50]])
    with pytest.raises(BadRowsError, match="50 of 50 rows"):
        prepare_dataset(DatasetSpec(path=str(tmp_path / "other.jsonl"), prepared_dir=str(tmp_path / "o2")), VOCAB)
    assert prepare_dataset(DatasetSpec(path=str(tmp_path / "other.jsonl"), prepared_dir=str(tmp_path / "o3"),
                                       text_field="content"), VOCAB).meta["documents"] == 50


def test_a_parquet_source_reads_its_text_column_by_row_groups_and_reports_empty_and_undecodable_rows(tmp_path, docs,
                                                                                                      tokenizer):
    good = docs[:200]
    values = [d.encode() for d in good[:100]] + [None] + [d.encode() for d in good[100:]] + [b"\xff\xfe"]
    table = pa.table({"id": list(range(len(values))), "text": pa.array(values, pa.binary())})
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=64)
    pq.write_table(pa.table({"text": pa.array(good[:10], pa.string())}), tmp_path / "part-1.parquet")
    spec = DatasetSpec(path=str(tmp_path), prepared_dir=str(tmp_path / "out"), tokenizer=str(tokenizer),
                       max_bad_fraction=0.02)
    data = prepare_dataset(spec, VOCAB)
    assert data.meta["bad_rows"] == {"rows": len(values) + 10, "bad": 2, "first": [
        "part-0.parquet:row 101: no value in 'text'",
        "part-0.parquet:row 202: not UTF-8 (invalid start byte at byte 0)"]}
    assert prepared_ids(data) == joined_ids(load_tokenizer(tokenizer), good + good[:10])
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "other.parquet")
    with pytest.raises(DataError, match=r"no column 'text'; its columns: body"):
        prepare_dataset(DatasetSpec(path=str(tmp_path / "other.parquet"), prepared_dir=str(tmp_path / "o2")), VOCAB)
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "numbers.parquet")
    with pytest.raises(DataError, match="holds int64, not text"):
        prepare_dataset(DatasetSpec(path=str(tmp_path / "numbers.parquet"), prepared_dir=str(tmp_path / "o3")), VOCAB)


def test_gpt2_vocab_and_merges_are_used_as_they_are_and_the_ids_are_the_tokenizers_own(tmp_path, docs):
    trained = ByteLevelBPETokenizer(add_prefix_space=False)
    trained.train_from_iterator(docs, vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False)
    (tmp_path / "gpt2").mkdir()
    trained.save_model(str(tmp_path / "gpt2"))  # vocab.json and merges.txt, as GPT-2 ships them
    text = "\n\n".join(docs[:100])
    (tmp_path / "plays.txt").write_text(text)
    spec = DatasetSpec(path=str(tmp_path / "plays.txt"), prepared_dir=str(tmp_path / "out"),
                       tokenizer=str(tmp_path / "gpt2"))
    data = prepare_dataset(spec, VOCAB)
    own = ByteLevelBPETokenizer(str(tmp_path / "gpt2" / "vocab.json"), str(tmp_path / "gpt2" / "merges.txt"),
                                add_prefix_space=False)
    assert prepared_ids(data) == own.encode(text).ids
    assert data.meta["tokenizer_reused"] and data.eos_id == own.token_to_id("<|endoftext|>")
    with pytest.raises(DataError, match="no tokenizer at"):
        prepare_dataset(DatasetSpec(path=str(tmp_path / "plays.txt"), prepared_dir=str(tmp_path / "o2"),
                                    tokenizer=str(tmp_path)), VOCAB)


def megatron_by_hand(prefix, documents: list[list[list[int]]]) -> None:
    """A Megatron-LM indexed dataset written from the format's description, not by this product: int32 ids, each
    document a list of sequences (a sentence-split corpus), little-endian header, lengths, byte offsets and
    document indices."""
    lengths = [len(seq) for doc in documents for seq in doc]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * 4
    doc_index = np.concatenate([[0], np.cumsum([len(doc) for doc in documents])]).astype(np.int64)
    with open(f"{prefix}.bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                f.write(np.asarray(seq, dtype="<i4").tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4))
        f.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_index)))
        f.write(np.asarray(lengths, dtype="<i4").tobytes() + offsets.astype("<i8").tobytes()
                + doc_index.astype("<i8").tobytes())


def megatron_documents(tok, texts: list[str]) -> list[list[list[int]]]:
    """Each text split at its lines into sequences, the end-of-text id closing the document (--append-eod)."""
    out = []
    for text in texts:
        lines = [line + "\n" for line in text.split("\n")]
        out.append([tok.encode(line) for line in lines[:-1]] + [tok.encode(lines[-1]) + [tok.eos_id]])
    return out


def test_a_megatron_dataset_built_from_the_format_is_read_document_by_document_and_trained_on_as_is(tmp_path, docs,
                                                                                                 tokenizer):
    tok = load_tokenizer(tokenizer)
    documents = megatron_documents(tok, docs[:200])
    megatron_by_hand(tmp_path / "corpus_text_document", documents)
    data = read_index(tmp_path / "corpus_text_document.idx")
    assert data.documents == 200 and data.dtype == np.int32
    for i in (0, 17, 199):
        assert data.document(i).tolist() == [t for seq in documents[i] for t in seq]
    spec = DatasetSpec(path=str(tmp_path / "corpus_text_document.bin"), prepared_dir=str(tmp_path / "out"),
                       tokenizer=str(tokenizer))
    prepared = prepare_dataset(spec, VOCAB)
    assert prepared_ids(prepared) == [t for doc in documents for seq in doc for t in seq]
    assert prepared.meta["source_kinds"] == ["megatron"] and prepared.meta["documents"] == 200
    with pytest.raises(DataError, match="Give the tokenizer they were made with"):
        prepare_dataset(DatasetSpec(path=spec.path, prepared_dir=str(tmp_path / "o2")), VOCAB)
    small = tmp_path / "small"
    small.mkdir()
    train_tokenizer(iter(docs[:50]), 300).save(str(small / "tokenizer.json"))
    with pytest.raises(DataError, match=r"holds token id \d+, but the tokenizer has 300 tokens"):
        prepare_dataset(spec.replace(prepared_dir=str(tmp_path / "o3"), tokenizer=str(small / "tokenizer.json")),
                        VOCAB)


def test_a_megatron_dataset_named_by_its_index_is_prepared_from_its_bin_or_refused_with_what_to_give(tmp_path, docs,
                                                                                                   tokenizer):
    import subprocess
    import sys
    documents = megatron_documents(load_tokenizer(tokenizer), docs[:50])
    megatron_by_hand(tmp_path / "corpus_text_document", documents)
    command = [sys.executable, "-m", "trainer.data", "prepare", "--path", str(tmp_path / "corpus_text_document.idx"),
               "--vocab", str(VOCAB), "--tokenizer", str(tokenizer), "--out", str(tmp_path / "out"), "--json",
               "--workers", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    meta = json.loads(done.stdout)
    assert meta["source_kinds"] == ["megatron"] and meta["documents"] == 50
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(seq) for doc in documents for seq in doc)
    (tmp_path / "corpus_text_document.bin").unlink()
    with pytest.raises(DataError, match=r"index of a Megatron dataset, whose tokens are in corpus_text_document\.bin, "
                                        r"which is not beside it"):
        prepare_dataset(DatasetSpec(path=str(tmp_path / "corpus_text_document.idx"), prepared_dir=str(tmp_path / "o"),
                                    tokenizer=str(tokenizer)), VOCAB)


def test_a_prepared_dataset_is_megatrons_format_read_back_id_for_id_with_its_documents_cut_at_the_split(tmp_path,
                                                                                                     docs):
    write_jsonl(tmp_path / "d.jsonl", [json.dumps({"text": d}).encode() for d in docs[:300]])
    data = prepare_dataset(DatasetSpec(path=str(tmp_path / "d.jsonl"), prepared_dir=str(tmp_path / "out")), VOCAB)
    train, val = read_index(data.train_path), read_index(data.val_path)
    assert train.tokens().tolist() == load_tokens(data.train_path).tolist()
    assert val.tokens().tolist() == load_tokens(data.val_path).tolist()
    assert int(train.sequence_lengths.sum()) == data.meta["train_tokens"]
    assert int(val.sequence_lengths.sum()) == data.meta["val_tokens"] == math.ceil(data.meta["tokens"] * 0.05)
    # every document but the one the split cuts ends with the end-of-text id, the last one of all excepted
    eos = data.eos_id
    assert all(train.document(i)[-1] == eos for i in range(train.documents - 1))
    assert train.documents + val.documents in (300, 301)


@pytest.fixture(scope="module")
def source_runs(tmp_path_factory, docs, tokenizer):
    """One tiny model trained a few steps on each kind of source, in one launch."""
    root = tmp_path_factory.mktemp("sources")
    write_jsonl(root / "talk.jsonl.zst", [json.dumps({"text": d}).encode() for d in docs])
    pq.write_table(pa.table({"text": docs}), root / "talk.parquet", row_group_size=256)
    megatron_by_hand(root / "talk_text_document", megatron_documents(load_tokenizer(tokenizer), docs))
    datasets = {"jsonl": DatasetSpec(path=str(root / "talk.jsonl.zst"), prepared_dir=str(root / "p-jsonl")),
                "parquet": DatasetSpec(path=str(root / "talk.parquet"), prepared_dir=str(root / "p-parquet")),
                "megatron": DatasetSpec(path=str(root / "talk_text_document.bin"), prepared_dir=str(root / "p-mega"),
                                        tokenizer=str(tokenizer))}
    jobs = []
    for kind, dataset in datasets.items():
        spec = tiny_spec(root / f"run-{kind}", dataset, steps=8, layers=2)
        jobs.append({"spec": spec, "run_dir": spec.output_dir, "resume": False, "stop_at": 0})
    launch(1, jobs, root / "jobs")
    return root


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "megatron"])
def test_each_kind_of_source_trains_a_tiny_model(source_runs, kind):
    got = losses(source_runs / f"run-{kind}")
    assert len(got) == 8 and all(math.isfinite(x) for x in got) and got[-1] < got[0]


def test_the_command_line_reports_the_bad_rows_and_a_refusal_as_json(tmp_path, docs):
    import subprocess
    import sys
    write_jsonl(tmp_path / "chat.jsonl", [json.dumps({"text": d}).encode() for d in docs[:200]] + [b"{oops"])
    command = [sys.executable, "-m", "trainer.data", "prepare", "--path", str(tmp_path / "chat.jsonl"), "--vocab",
               str(VOCAB), "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "skipped 1 of 201 rows: chat.jsonl:201: not JSON" in done.stdout and "train.idx beside it" in done.stdout
    refused = subprocess.run(command[:-1] + [str(tmp_path / "o2"), "--max-bad-fraction", "0", "--json"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    answer = json.loads(refused.stdout)
    assert answer["bad_rows"]["bad"] == 1 and "max_bad_fraction=0.0" in answer["refused"]
