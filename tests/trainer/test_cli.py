"""python -m trainer as the workers launch it: refusals before any work, SIGTERM, failures, profiling."""
import json
import signal
import subprocess
import time

import pytest

from tests.trainer.launch import PYTHON, REPO, _env, records, tiny_spec
from trainer.contract import ProfileSpec


def _start(spec, tmp_path, *args):
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    return subprocess.Popen([PYTHON, "-m", "trainer", "--spec", str(path), *args], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("change, reason", [
    (dict(tp=3), "tp=3 does not divide n_heads=4"),
    (dict(global_batch=7), "global_batch=7 is not divisible"),
])
def test_it_refuses_what_it_cannot_run_before_any_work(tmp_path, dataset, change, reason):
    data = tiny_spec(tmp_path / "run", dataset).to_dict()
    data["plan"].update(change)
    (tmp_path / "spec.json").write_text(json.dumps(data))
    proc = subprocess.Popen([PYTHON, "-m", "trainer", "--spec", str(tmp_path / "spec.json")], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert reason in err
    # nothing done, but the reason is where the web app reads it
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["events.jsonl"]
    (event,) = records(tmp_path / "run", "events.jsonl")
    assert event["event"] == "failed" and reason in event["error"]


@pytest.mark.slow
def test_it_stops_cleanly_on_sigterm(tmp_path, dataset):
    run = tmp_path / "run"
    proc = _start(tiny_spec(run, dataset, steps=10_000), tmp_path)
    deadline = time.time() + 120
    while len(records(run)) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 0
    events = records(run, "events.jsonl")
    assert [e["event"] for e in events] == ["started", "checkpoint_saved", "stopped"]
    stopped_at = events[-1]["step"]
    assert events[1]["step"] == stopped_at and records(run)[-1]["step"] == stopped_at
    assert (run / "checkpoints" / f"step-{stopped_at}" / "manifest.json").is_file()


@pytest.mark.slow
def test_it_records_a_failure_with_its_traceback(tmp_path, dataset):
    spec = tiny_spec(tmp_path / "run", dataset.replace(path=str(tmp_path / "missing.txt"),
                                                       prepared_dir=str(tmp_path / "prep")))
    proc = _start(spec, tmp_path)
    proc.communicate(timeout=120)
    assert proc.returncode == 1
    failed = records(tmp_path / "run", "events.jsonl")[-1]
    assert failed["event"] == "failed" and "does not exist" in failed["traceback"]
    assert "failed" in (tmp_path / "run" / "logs" / "rank-0.log").read_text()


@pytest.mark.slow
def test_it_profiles_the_steps_asked_for(tmp_path, dataset):
    run = tmp_path / "run"
    spec = tiny_spec(run, dataset, steps=5, profile=ProfileSpec(start_step=2, steps=2, warmup=1, name="p"))
    proc = _start(spec, tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    written = [e for e in records(run, "events.jsonl") if e["event"] == "profile_written"]
    assert len(written) == 1 and written[0]["name"] == "p"
    summary = json.loads((run / "profiles" / "p" / "summary.json").read_text())
    assert summary
    assert (run / "profiles" / "p" / "rank-0.trace.json.gz").is_file()


@pytest.mark.slow
def test_it_stops_every_rank_at_the_same_step_under_torchrun(tmp_path, dataset):
    """torchrun passes SIGTERM on to the ranks; they agree on a step, save and record "stopped". (torchrun itself
    then exits 1 because it was signalled: a launcher reads the outcome from events.jsonl, not from its status.)"""
    from tests.trainer.launch import free_port

    run = tmp_path / "run"
    spec = tiny_spec(run, dataset, steps=10_000, tp=2)
    (tmp_path / "spec.json").write_text(spec.to_json())
    proc = subprocess.Popen([PYTHON, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                             f"--master_port={free_port()}", "-m", "trainer", "--spec", str(tmp_path / "spec.json")],
                            cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while len(records(run)) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    events = records(run, "events.jsonl")
    assert [e["event"] for e in events] == ["started", "checkpoint_saved", "stopped"]
    step = events[-1]["step"]
    assert (run / "checkpoints" / f"step-{step}" / "manifest.json").is_file()
    assert sorted(p.name for p in (run / "checkpoints" / f"step-{step}").glob("rng-rank*.pt")) == \
        ["rng-rank0.pt", "rng-rank1.pt"]


def _run(tmp_path, data: dict, *args, env=None) -> subprocess.CompletedProcess:
    (tmp_path / "spec.json").write_text(json.dumps(data))
    return subprocess.run([PYTHON, "-m", "trainer", "--spec", str(tmp_path / "spec.json"), *args], cwd=REPO,
                          env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=300)


def test_it_refuses_a_wrong_process_count_in_one_line_before_building_anything(tmp_path, dataset):
    error_file = tmp_path / "torchrun-error.json"
    started = time.perf_counter()
    done = _run(tmp_path, tiny_spec(tmp_path / "run", dataset, tp=2).to_dict(),
                env={"WORLD_SIZE": "3", "RANK": "0", "TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert done.returncode == 2 and time.perf_counter() - started < 30
    lines = done.stderr.strip().splitlines()
    assert lines == ["error: the plan needs dp×tp×pp=1×2×1=2 processes but this job started 3: launch with "
                     "--nproc_per_node=2 (or as many tasks)"]
    # under torchrun, its failure summary shows this reason instead of a pointer to its documentation
    assert "needs dp×tp×pp=1×2×1=2 processes" in json.loads(error_file.read_text())["message"]
    # the other ranks refuse silently: one line in all
    assert _run(tmp_path, tiny_spec(tmp_path / "run", dataset, tp=2).to_dict(),
                env={"WORLD_SIZE": "3", "RANK": "1"}).stderr == ""


@pytest.mark.slow
def test_it_refuses_a_used_run_folder_unless_told_to_resume_or_start_over(tmp_path, dataset):
    run = tmp_path / "run"
    data = tiny_spec(run, dataset, steps=2).to_dict()
    assert _run(tmp_path, data).returncode == 0
    events = (run / "events.jsonl").read_text()

    again = _run(tmp_path, data)
    assert again.returncode == 2 and "--resume to continue it or --restart to start over" in again.stderr
    assert (run / "events.jsonl").read_text() == events  # another run's folder: nothing written into it

    assert _run(tmp_path, data, "--restart").returncode == 0
    assert [r["step"] for r in records(run) if "loss" in r] == [1, 2]  # one series, not two
    assert [e["event"] for e in records(run, "events.jsonl")] == ["started", "finished"]


@pytest.mark.slow
def test_it_runs_on_this_machines_cpu_ranks_when_the_spec_names_no_cluster(tmp_path, dataset):
    data = tiny_spec(tmp_path / "run", dataset, steps=2).to_dict()
    del data["cluster"]
    done = _run(tmp_path, data)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["step"] for r in records(tmp_path / "run") if "loss" in r] == [1, 2]
    assert records(tmp_path / "run")[0]["mfu"] > 0  # against the CPU device's figures
