"""Datasets: registered under a data root the owner may read, or uploaded into their own folder; the path rules
(trainer.contract.datapath) hold at registration, at run creation, and in the trainer before it reads."""
import os

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile

from trainer.contract import presets
from trainer.contract.datapath import DataPathError, data_files
from trainer.data.errors import DataError
from trainer.data.prepare import _source_files
from webapp import models


def _register(client, path, name="d", **fields):
    return client.post("/api/datasets/", {"name": name, "path": str(path), **fields}, format="json")


def _upload(client, name="mine", content=b"To be, or not to be.\n" * 20, filename="plays.txt", **fields):
    return client.post("/api/datasets/upload/", {"name": name, "file": SimpleUploadedFile(filename, content),
                                                 **fields}, format="multipart")


def _refusal(answer) -> str:
    assert answer.status_code == 400, answer.data
    return answer.data["path"][0]


def test_it_stores_an_upload_in_the_owners_folder_and_registers_it(alice, api, data_root):
    answer = _upload(api(alice), filename="../../etc/.plays.txt", shared=True)
    assert answer.status_code == 201, answer.data
    path = data_root / "uploads" / str(alice.pk) / "plays.txt"  # no folder of the client's name, not hidden
    assert answer.data["path"] == str(path) and answer.data["shared"] is True
    assert path.read_bytes() == b"To be, or not to be.\n" * 20
    again = _upload(api(alice), name="again")
    assert again.status_code == 201 and again.data["path"].endswith("/plays-2.txt")
    clash = _upload(api(alice), name="mine")
    assert clash.status_code == 400 and "already have a dataset named 'mine'" in clash.data["name"][0]


def test_it_refuses_an_upload_over_the_limit_or_not_text_and_keeps_nothing(alice, api, data_root, settings):
    settings.WORKBENCH = {**settings.WORKBENCH, "MAX_UPLOAD_BYTES": 100}
    too_large = _upload(api(alice), content=b"x" * 101)
    assert too_large.status_code == 413 and "over 100 bytes (WORKBENCH_MAX_UPLOAD_MB)" in too_large.data["detail"]
    declared = _upload(api(alice), content=b"x" * 100_000)  # refused on its Content-Length, before parsing
    assert declared.status_code == 413 and "files of at most 100 bytes" in declared.data["detail"]
    binary = _upload(api(alice), content=b"\xff\xfe\x00\x01")
    assert binary.status_code == 400 and "not UTF-8 text" in binary.data["file"][0]
    folder = data_root / "uploads" / str(alice.pk)
    assert not folder.exists() or list(folder.iterdir()) == []
    assert not models.Dataset.objects.exists()


def test_it_takes_parquet_and_compressed_jsonl_uploads_by_their_names_and_refuses_one_that_is_not(
        alice, api, data_root, tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.data.sources import RowReport, pieces

    pq.write_table(pa.table({"body": ["To be, or not to be.", "That is the question."]}), tmp_path / "t.parquet")
    parquet = _upload(api(alice), name="plays", filename="plays.parquet", text_field="body",
                      content=(tmp_path / "t.parquet").read_bytes())
    assert parquet.status_code == 201, parquet.data
    assert parquet.data["text_field"] == "body" and parquet.data["path"].endswith("/plays.parquet")
    report = RowReport()
    texts = [text for _, text in pieces(data_root / "uploads" / str(alice.pk) / "plays.parquet", "plays.parquet",
                                        "body", report)]
    assert texts == ["To be, or not to be.", "That is the question."] and report.bad == 0
    packed = _upload(api(alice), name="lines", filename="lines.jsonl.gz",
                     content=gzip.compress(b'{"text": "Now is the winter of our discontent."}\n'))
    assert packed.status_code == 201, packed.data
    pretend = _upload(api(alice), name="pretend", filename="fake.parquet", content=b"To be, or not to be.\n")
    assert pretend.status_code == 400 and "named .parquet but is not such a file" in pretend.data["file"][0]
    assert sorted(p.name for p in (data_root / "uploads" / str(alice.pk)).iterdir()) == \
        ["lines.jsonl.gz", "plays.parquet"]


def test_it_refuses_to_register_another_users_uploaded_file_as_it_does_a_missing_one(alice, bob, api, data_root):
    uploaded = _upload(api(alice)).data["path"]
    theirs = _refusal(_register(api(bob), uploaded))
    missing = _refusal(_register(api(bob), data_root / "uploads" / str(alice.pk) / "nothing.txt"))
    assert "is not a file or folder you may use" in theirs
    assert theirs.replace(uploaded, "X") == missing.replace(str(data_root / "uploads" / str(alice.pk) /
                                                                  "nothing.txt"), "X")
    assert _register(api(alice), uploaded, name="again").status_code == 201  # hers to register again


def test_it_refuses_the_data_root_itself_and_folders_holding_others_uploads(alice, bob, api, data_root):
    _upload(api(alice))
    assert "is a data root itself" in _refusal(_register(api(bob), data_root))
    assert "is not a file or folder you may use" in _refusal(_register(api(bob), data_root / "uploads"))
    (data_root / "plays").mkdir()
    (data_root / "plays" / "hamlet.txt").write_text("To be.\n")
    assert _register(api(bob), data_root / "plays").status_code == 201


def test_it_lets_staff_open_a_data_root_to_a_user_or_a_group(alice, bob, api, tmp_path, data_root):
    private = tmp_path / "lab"
    private.mkdir()
    (private / "notes.txt").write_text("lab notes\n")
    root = models.DataRoot.objects.create(path=str(private))
    root.full_clean()
    assert "is not a file or folder you may use" in _refusal(_register(api(alice), private / "notes.txt"))
    root.users.add(alice)
    assert _register(api(alice), private / "notes.txt").status_code == 201
    assert "is not a file or folder you may use" in _refusal(_register(api(bob), private / "notes.txt"))
    lab = Group.objects.create(name="lab")
    lab.user_set.add(bob)
    root.groups.add(lab)
    assert _register(api(bob), private / "notes.txt").status_code == 201


def test_it_excludes_a_users_data_root_from_others_even_inside_a_common_root(alice, bob, api, data_root):
    (data_root / "alice-only").mkdir()
    (data_root / "alice-only" / "x.txt").write_text("x\n")
    models.DataRoot.objects.create(path=str(data_root / "alice-only")).users.add(alice)
    assert _register(api(alice), data_root / "alice-only" / "x.txt").status_code == 201
    assert "is not a file or folder you may use" in _refusal(_register(api(bob), data_root / "alice-only" / "x.txt"))


@pytest.mark.parametrize("path, message", [("relative/folder", "is a relative path"),
                                           ("/", "the file system's root would open every file"),
                                           ("/no/such/folder", "is not an existing folder on this server")])
def test_it_checks_a_data_roots_folder_in_the_admin(db, path, message):
    with pytest.raises(ValidationError, match=message):
        models.DataRoot(path=path).full_clean()


def test_it_refuses_a_symlink_whose_target_leaves_the_root(alice, api, data_root, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("secret\n")
    (data_root / "link.txt").symlink_to(outside)
    assert "is not a file or folder you may use" in _refusal(_register(api(alice), data_root / "link.txt"))
    (data_root / "folder").mkdir()
    (data_root / "folder" / "ok.txt").write_text("ok\n")
    (data_root / "folder" / "leak.txt").symlink_to(outside)
    refusal = _refusal(_register(api(alice), data_root / "folder"))
    assert refusal == (f"{data_root / 'folder' / 'leak.txt'} is a symbolic link to a place outside the dataset "
                       f"folder: copy the data into the folder instead of linking to it")


def test_it_refuses_fifos_and_devices(alice, api, data_root):
    os.mkfifo(data_root / "pipe.txt")
    assert "is a FIFO (named pipe), not a regular file" in _refusal(_register(api(alice), data_root / "pipe.txt"))
    (data_root / "folder").mkdir()
    (data_root / "folder" / "a.txt").write_text("a\n")
    os.mkfifo(data_root / "folder" / "pipe")
    assert "folder/pipe is a FIFO (named pipe)" in _refusal(_register(api(alice), data_root / "folder"))
    (data_root / "null").symlink_to("/dev/null")
    assert "is not a file or folder you may use" in _refusal(_register(api(alice), data_root / "null"))


def test_it_catches_a_symlink_repointed_after_registration_when_a_run_is_created(alice, api, data_root, tmp_path,
                                                                                  plan222):
    (data_root / "link.txt").symlink_to(data_root / "corpus.txt")
    registered = _register(api(alice), data_root / "link.txt")
    assert registered.status_code == 201
    (data_root / "link.txt").unlink()
    (data_root / "link.txt").symlink_to("/etc/passwd")
    run = api(alice).post("/api/runs/", {"name": "r", "plan": plan222.id, "dataset": registered.data["id"]},
                          format="json")
    assert run.status_code == 400
    assert f"dataset 'd': {data_root / 'link.txt'} is not a file or folder you may use" in run.data["dataset"][0]


def test_it_reads_the_same_files_the_trainer_reads(data_root):
    (data_root / "folder" / "sub").mkdir(parents=True)
    for name in ("b.txt", "a.txt", "sub/c.txt", ".hidden", "sub/.git/x"):
        (data_root / "folder" / name).parent.mkdir(parents=True, exist_ok=True)
        (data_root / "folder" / name).write_text(name)
    web = data_files(data_root / "folder", [data_root])
    trainer = _source_files(data_root / "folder", data_root / "folder.prepared")
    assert web == trainer == [data_root / "folder" / n for n in ("a.txt", "b.txt", "sub/c.txt")]


def test_it_has_the_trainer_refuse_fifos_and_links_out_of_the_folder_before_it_reads(data_root, tmp_path):
    (data_root / "folder").mkdir()
    (data_root / "folder" / "a.txt").write_text("a\n")
    os.mkfifo(data_root / "folder" / "pipe")
    with pytest.raises(DataError, match="pipe is a FIFO"):
        _source_files(data_root / "folder", tmp_path / "prepared")
    os.remove(data_root / "folder" / "pipe")
    (data_root / "folder" / "leak.txt").symlink_to(tmp_path)
    with pytest.raises(DataError, match="leak.txt is a symbolic link to a place outside the dataset folder"):
        _source_files(data_root / "folder", tmp_path / "prepared")
    with pytest.raises(DataError, match="does not exist"):  # its own message for a missing source stays
        _source_files(data_root / "missing", tmp_path / "prepared")
    with pytest.raises(DataPathError, match="relative path"):
        data_files("folder", [data_root])


def test_a_preparation_asked_for_on_a_slurm_cluster_names_it_and_an_unknown_cluster_is_refused(alice, api,
                                                                                                 data_root):
    dataset = _upload(api(alice)).data
    slurm = models.Cluster.objects.create(name="hpc", kind="slurm", partition="batch",
                                          spec=presets.cluster("cpu", nodes=1, gpus_per_node=1).to_dict())
    answer = api(alice).post(f"/api/datasets/{dataset['id']}/prepare/", {"vocab": 300, "cluster": slurm.pk},
                             format="json")
    assert answer.status_code == 202, answer.data
    assert (answer.data["cluster"], answer.data["job_id"], answer.data["status"]) == (slurm.pk, "", "pending")
    assert models.DatasetPreparation.objects.get().cluster == slurm
    missing = api(alice).post(f"/api/datasets/{dataset['id']}/prepare/", {"vocab": 300, "cluster": slurm.pk + 1},
                              format="json")
    assert missing.status_code == 400 and "cluster" in missing.data
