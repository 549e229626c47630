"""Logs by byte offset: exactly the bytes after the offset, bounded, whole characters, only the run's own log files,
and only for users who may see the run."""
import os
from pathlib import Path

import pytest

from tests.webapp.live_runs import new_run

TEXT = "step 1 loss 4.0 — ünïcødé ✓\n".encode() * 40 + b"\xff\xfe not UTF-8\n"


@pytest.fixture
def run(alice, plan222, corpus):
    run = new_run(alice, plan222, corpus)
    logs = Path(run.run_dir) / "logs"
    logs.mkdir(parents=True)
    (logs / "rank-0.log").write_bytes(TEXT)
    (logs / "rank-1.log").write_bytes(b"one line\n")
    (logs / "launcher.log").write_bytes(b"started\n")
    (logs / "slurm-4242.out").write_bytes(b"slurm says hi\n")
    (logs / "notes.txt").write_bytes(b"not a log the API serves\n")
    return run


def _read(api, user, run, **params):
    return api(user).get(f"/api/runs/{run.id}/logs/", params)


def test_it_lists_the_log_files_with_their_sizes_when_none_is_named(alice, api, run):
    files = _read(api, alice, run).json()["files"]
    assert files == [{"name": "launcher.log", "size": 8}, {"name": "slurm-4242.out", "size": 14},
                     {"name": "rank-0.log", "size": len(TEXT)}, {"name": "rank-1.log", "size": 9}]


def test_it_reads_exactly_the_bytes_after_the_offset_in_bounded_chunks_of_whole_characters(alice, api, run):
    offset, pieces = 0, []
    while True:
        chunk = _read(api, alice, run, rank=0, offset=offset, limit=100).json()
        assert chunk["offset"] == offset and chunk["size"] == len(TEXT)
        assert 96 < chunk["next_offset"] - offset <= 100 or not chunk["more"]
        assert chunk["text"].encode() == TEXT[offset:chunk["next_offset"]] or not chunk["more"]
        pieces.append(chunk["text"])
        offset = chunk["next_offset"]
        if not chunk["more"]:
            break
    assert offset == len(TEXT)
    assert "".join(pieces) == TEXT.decode("utf-8", errors="replace")  # the bytes that are not UTF-8 as U+FFFD
    middle = _read(api, alice, run, file="rank-0.log", offset=7, limit=5).json()
    assert middle["text"].encode() == TEXT[7:12] and middle["more"]
    past = _read(api, alice, run, rank=1, offset=10**6).json()
    assert (past["text"], past["offset"], past["next_offset"], past["more"]) == ("", 9, 9, False)


@pytest.mark.parametrize("name", ["../spec.json", "../../etc/passwd", "notes.txt", "/etc/passwd", "rank-0.log/..",
                                  "rank-9.log", "logs/rank-0.log", "slurm-../../x.out"])
def test_it_refuses_names_that_are_not_the_runs_log_files(alice, api, run, name):
    assert _read(api, alice, run, file=name).status_code == 404


def test_it_refuses_a_link_that_leads_out_of_the_run_folder(alice, api, run, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    os.symlink(secret, Path(run.run_dir) / "logs" / "rank-7.log")
    assert _read(api, alice, run, rank=7).status_code == 404
    assert "rank-7.log" not in [f["name"] for f in _read(api, alice, run).json()["files"]]


def test_it_hides_another_users_run_and_bounds_what_it_reads(alice, bob, api, run):
    assert _read(api, bob, run, rank=0).status_code == 404
    assert _read(api, bob, run).status_code == 404
    assert _read(api, alice, run, rank=0, limit=2**21).status_code == 400
    assert _read(api, alice, run, rank=0, file="rank-0.log").status_code == 400
    assert _read(api, alice, run, rank=-1).status_code == 400
