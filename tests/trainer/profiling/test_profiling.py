import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trainer.profiling.digest import is_communication, summarize_trace, summarize_traces, write_summary
from trainer.profiling.intervals import intersect, subtract, total, union
from trainer.profiling.profiler import StepProfiler
from trainer.contract import ProfileSpec

REPO = Path(__file__).resolve().parents[3]

# A 2-rank gloo job: each step computes, all-reduces a gradient-sized tensor asynchronously while it computes more
# (overlapped communication), then all-reduces synchronously (exposed), as a data-parallel step does.
JOB = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from trainer.profiling.digest import write_summary
    from trainer.profiling.profiler import StepProfiler, prepare
    from trainer.contract import ProfileSpec

    prepare()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    out = Path(sys.argv[1])
    w = torch.randn(192, 192)
    with StepProfiler(ProfileSpec(start_step=2, steps=3, warmup=1, name="dp"), out, rank) as profiler:
        for step in range(6):
            x = torch.randn(64, 192)
            for _ in range(4):
                x = torch.tanh(x @ w)
            work = dist.all_reduce(torch.ones(400_000), async_op=True)
            for _ in range(8):
                x = torch.tanh(x @ w)
            work.wait()
            dist.all_reduce(x)
            profiler.step()
    dist.barrier()  # every rank's summary is on disk before rank 0 merges them
    if rank == 0:
        write_summary(profiler.folder)
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def two_rank_profile(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("profile")
    (tmp / "job.py").write_text(JOB)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(tmp / "job.py"), str(tmp / "run")], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp / "run" / "profiles" / "dp"


# ------------------------------------------------------------------ a real 2-rank profile


@pytest.mark.slow
def test_it_writes_a_gzipped_trace_summary_and_timeline_per_rank_and_a_merged_summary(two_rank_profile):
    names = sorted(p.name for p in two_rank_profile.iterdir())
    assert names == ["rank-0.trace.json.gz", "rank-1.trace.json.gz", "summary-rank-0.json", "summary-rank-1.json",
                     "summary.json", "timeline-rank-0.json", "timeline-rank-1.json"]
    with gzip.open(two_rank_profile / "rank-1.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    assert sum(e.get("name", "").startswith("ProfilerStep#") for e in events) == 3
    assert any(e.get("name") == "gloo:all_reduce" for e in events)
    merged = json.loads((two_rank_profile / "summary.json").read_text())
    assert merged["world"] == 2 and [r["rank"] for r in merged["ranks"]] == [0, 1]


@pytest.mark.slow
def test_it_splits_each_rank_step_into_compute_communication_and_idle_shares_that_sum_to_one(two_rank_profile):
    merged = json.loads((two_rank_profile / "summary.json").read_text())
    for summary in merged["ranks"] + [merged]:
        shares = summary["shares"]
        assert shares["compute"] + shares["comm_exposed"] + shares["idle"] == pytest.approx(1.0, abs=1e-6)
        assert shares["compute"] > 0.01 and shares["comm"] > 0
        assert 0 <= shares["comm_overlapped"] <= shares["comm"]
        assert summary["bubble"] == pytest.approx(1 - shares["compute"], abs=1e-6)
    for rank in merged["ranks"]:
        assert rank["steps"] == 3 and len(rank["step_ms"]) == 3
        assert rank["wall_ms"] == pytest.approx(sum(rank["step_ms"]), rel=1e-3)
        assert rank["compute_ms"] + rank["comm_exposed_ms"] + rank["idle_ms"] == pytest.approx(rank["wall_ms"],
                                                                                               rel=1e-3)
        ops = {op["name"]: op for op in rank["top_ops"]}
        assert len(rank["top_ops"]) <= 15 and ops["aten::mm"]["count"] == 3 * 12
        assert ops["gloo:all_reduce"]["comm"] and ops["gloo:all_reduce"]["count"] >= 5
        assert {c["name"] for c in rank["comm_ops"]} >= {"gloo:all_reduce", "c10d::allreduce_"}


@pytest.mark.slow
def test_it_summarizes_a_folder_of_traces_as_the_ranks_did(two_rank_profile):
    again = summarize_traces(two_rank_profile)
    merged = json.loads((two_rank_profile / "summary.json").read_text())
    assert again["shares"] == pytest.approx(merged["shares"])
    assert [r["wall_ms"] for r in again["ranks"]] == [r["wall_ms"] for r in merged["ranks"]]


# ------------------------------------------------------------------ the profiler in one process

# A fresh process, as a rank is: the profiler is prepared before the group is joined, the profile starts after. destroy_process_group must then free the group, for only then are gloo's worker threads joined while the
# interpreter still runs (a worker that drops a tensor during its shutdown aborts the rank).
GROUP_FREED = textwrap.dedent("""
    import sys, weakref
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from trainer.profiling.profiler import StepProfiler, prepare
    from trainer.contract import ProfileSpec

    prepare()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = weakref.ref(dist.group.WORLD)
    with StepProfiler(ProfileSpec(start_step=0, steps=1, warmup=0, name="p"), Path(sys.argv[1]), 0) as profiler:
        dist.all_reduce(torch.ones(8))
        profiler.step()
    assert profiler.written
    dist.destroy_process_group()
    print("held" if group() is not None else "freed")
""")


def test_it_leaves_the_process_group_free_to_be_destroyed(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", GROUP_FREED, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "freed", \
        "after a profile something still holds the process group: destroy_process_group leaves gloo's threads running"


def run_steps(profiler: StepProfiler, n: int) -> None:
    w = torch.randn(32, 32)
    for _ in range(n):
        torch.tanh(torch.randn(8, 32) @ w)
        profiler.step()


def test_it_does_nothing_without_a_profile_spec(tmp_path):
    with StepProfiler(None, tmp_path, rank=0) as profiler:
        run_steps(profiler, 3)
    assert not profiler.enabled and not profiler.written and not (tmp_path / "profiles").exists()


def test_it_profiles_exactly_the_named_steps(tmp_path):
    with StepProfiler(ProfileSpec(start_step=3, steps=2, warmup=1, name="p"), tmp_path, rank=3) as profiler:
        run_steps(profiler, 5)
        assert profiler.written and not profiler.enabled  # written after step 4, released at once
        run_steps(profiler, 3)
    folder = tmp_path / "profiles" / "p"
    assert sorted(p.name for p in folder.iterdir()) == ["rank-3.trace.json.gz", "summary-rank-3.json",
                                                        "timeline-rank-3.json"]
    summary = json.loads((folder / "summary-rank-3.json").read_text())
    assert summary["rank"] == 3 and summary["steps"] == 2 and summary["shares"]["comm"] == 0
    assert {op["name"] for op in summary["top_ops"]} >= {"aten::mm", "aten::tanh"}
    assert write_summary(folder)["world"] == 1 and (folder / "summary.json").is_file()


def test_it_profiles_the_same_absolute_steps_after_a_resume(tmp_path):
    spec = ProfileSpec(start_step=4, steps=2, warmup=2, name="p")
    with StepProfiler(spec, tmp_path, rank=0, first_step=3) as profiler:  # resumed at step 3: 1 lead step
        run_steps(profiler, 4)
    assert profiler.written and profiler.summary["steps"] == 2
    with StepProfiler(spec, tmp_path / "late", rank=0, first_step=5) as late:  # past the window
        run_steps(late, 3)
    assert not late.enabled and not late.written


def test_it_writes_what_it_has_when_the_run_ends_inside_the_window(tmp_path):
    with StepProfiler(ProfileSpec(start_step=1, steps=5, warmup=0, name="p"), tmp_path, rank=0) as profiler:
        run_steps(profiler, 3)
    # Steps 1 and 2 finished; the unfinished one the stop cut short is in the trace but not in the summary.
    assert profiler.written and profiler.summary["steps"] == 2


# ------------------------------------------------------------------ interval arithmetic and synthetic traces


def test_it_does_interval_arithmetic_on_unions():
    a = union([(5, 7), (0, 2), (1, 3), (9, 9), (6, 8)])
    assert a == [(0, 3), (5, 8)]
    b = union([(2, 6), (7, 10)])
    assert intersect(a, b) == [(2, 3), (5, 6), (7, 8)]
    assert subtract(a, b) == [(0, 2), (6, 7)]
    assert subtract(b, a) == [(3, 5), (8, 10)]
    assert total(a) == 6 and subtract(a, []) == a and intersect(a, []) == []
    assert total(union(a + b)) == total(a) + total(b) - total(intersect(a, b))


def test_it_recognizes_communication_events_by_name():
    for name in ["gloo:all_reduce", "gloo:recv", "nccl:all_gather", "c10d::allreduce_", "c10d::recv_",
                 "_c10d_functional::all_reduce", "record_param_comms", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"]:
        assert is_communication(name), name
    for name in ["aten::mm", "torch.distributed.ddp.reducer::copy_bucket_to_grad", "Optimizer.step#AdamW.step"]:
        assert not is_communication(name), name


def X(name, ts, dur, tid=1, cat="cpu_op", pid=100):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def write_trace(path: Path, events: list[dict]) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_it_counts_nested_operators_once_and_communication_inside_them_as_communication(tmp_path):
    events = [
        X("ProfilerStep#0", 0, 100, cat="user_annotation"),
        X("Optimizer.step#SGD.step", 0, 100, cat="user_annotation"),  # a label: no work by itself
        X("aten::linear", 0, 30), X("aten::addmm", 5, 20),  # nested: 30 µs of compute, not 50
        X("c10d::allreduce_", 30, 10), X("aten::copy_", 32, 4),  # a copy inside a collective is communication
        X("gloo:all_reduce", 35, 25, tid=2, cat="user_annotation"),  # overlaps the main thread's mm from 50
        X("aten::mm", 50, 20),
        X("gloo:recv", 80, 10, cat="user_annotation"),  # blocked receiving: exposed; 70–80 and 90–100 idle
    ]
    s = summarize_trace(write_trace(tmp_path / "rank-0.trace.json.gz", events))
    assert s["wall_ms"] == pytest.approx(0.1)
    assert s["compute_ms"] == pytest.approx(0.05)  # 0–30 and 50–70
    assert s["comm_ms"] == pytest.approx(0.04)  # 30–60 and 80–90
    assert s["comm_overlapped_ms"] == pytest.approx(0.01)  # 50–60
    assert s["comm_exposed_ms"] == pytest.approx(0.03)
    assert s["idle_ms"] == pytest.approx(0.02)
    assert s["shares"] == pytest.approx({"compute": 0.5, "comm_exposed": 0.3, "idle": 0.2, "comm_overlapped": 0.1,
                                         "comm": 0.4})
    ops = {op["name"]: op for op in s["top_ops"]}
    assert ops["aten::linear"]["self_ms"] == pytest.approx(0.01) and ops["aten::linear"]["total_ms"] == 0.03
    assert ops["c10d::allreduce_"]["self_ms"] == pytest.approx(0.006)
    assert "Optimizer.step#SGD.step" not in ops and "ProfilerStep#0" not in ops


def test_it_counts_compute_while_an_asynchronous_send_is_in_flight_on_the_same_thread(tmp_path):
    events = [
        X("ProfilerStep#0", 0, 100, cat="user_annotation"),
        X("c10d::send", 0, 10), X("gloo:send", 9, 61, cat="user_annotation"),  # isend: in flight until 70
        X("aten::mm", 10, 40),  # the next micro-batch runs meanwhile
        X("c10d::recv_", 50, 5), X("gloo:recv", 55, 35, cat="user_annotation"),  # blocked receiving until 90
        X("aten::mm", 90, 10),
    ]
    s = summarize_trace(write_trace(tmp_path / "rank-0.trace.json.gz", events))
    assert s["compute_ms"] == pytest.approx(0.05)  # 10–50 and 90–100
    assert s["comm_overlapped_ms"] == pytest.approx(0.04) and s["comm_exposed_ms"] == pytest.approx(0.05)
    assert s["idle_ms"] == pytest.approx(0.0)


def test_it_measures_a_pipeline_bubble_as_the_time_a_stage_does_not_compute(tmp_path):
    # The last of p = 2 stages in a GPipe step with m = 4 micro-batches, 10 µs per forward and per backward on each
    # stage: it waits for stage 0's first forward (0–10), runs 4 forwards (10–50) and 4 backwards (50–90), then
    # the step ends when stage 0 has run its last backward (90–100). It computes 80 of (m + p − 1) × 20 = 100 µs.
    events = [X("ProfilerStep#0", 0, 100, cat="user_annotation"), X("gloo:recv", 0, 10, cat="user_annotation")]
    events += [X("aten::mm", 10 + 10 * i, 10) for i in range(8)]
    s = summarize_trace(write_trace(tmp_path / "rank-1.trace.json.gz", events))
    assert s["bubble"] == pytest.approx((2 - 1) / (4 + 2 - 1))
    assert s["shares"]["comm_exposed"] == pytest.approx(0.1) and s["shares"]["idle"] == pytest.approx(0.1)


def test_it_reads_the_device_timeline_when_the_trace_has_kernels(tmp_path):
    events = [
        X("ProfilerStep#0", 0, 100, cat="user_annotation"),
        X("aten::mm", 0, 100),  # host op: only launches, ignored when kernels exist
        X("ampere_sgemm_128x64", 10, 40, pid=0, tid=7, cat="kernel"),
        X("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 40, pid=0, tid=20, cat="kernel"),
    ]
    s = summarize_trace(write_trace(tmp_path / "t.json.gz", events))
    assert s["timeline"] == "device"
    assert s["shares"] == pytest.approx({"compute": 0.4, "comm_exposed": 0.2, "idle": 0.4, "comm_overlapped": 0.2,
                                         "comm": 0.4})


def test_it_merges_rank_summaries_and_digests_a_trace_whose_summary_is_missing(tmp_path):
    step = X("ProfilerStep#0", 0, 100, cat="user_annotation")
    write_trace(tmp_path / "rank-0.trace.json.gz", [step, X("aten::mm", 0, 100)])
    write_trace(tmp_path / "rank-1.trace.json.gz",
                [step, X("aten::mm", 0, 50), X("gloo:recv", 50, 50, cat="user_annotation")])
    (tmp_path / "summary-rank-0.json").write_text(json.dumps({"rank": 0, **summarize_trace(
        tmp_path / "rank-0.trace.json.gz")}))
    merged = write_summary(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == merged
    assert merged["world"] == 2 and merged["bubble_max"] == pytest.approx(0.5)
    assert merged["shares"]["compute"] == pytest.approx(0.75)
    assert merged["top_ops"][0] == {"name": "aten::mm", "count": 2, "self_ms": 0.15, "total_ms": 0.15,
                                    "comm": False}
