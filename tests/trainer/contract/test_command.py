"""The one trainer command line: torchrun on one node, a fixed rendezvous, several nodes, srun, a bare process."""
import sys

import pytest

from trainer.contract.command import trainer_command

PY = sys.executable


def test_it_lets_torchrun_pick_a_port_on_one_node():
    assert trainer_command(["--spec", "s.json"], nproc_per_node=2) == [
        PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "trainer", "--spec", "s.json"]


def test_it_meets_at_a_given_master_address_and_port():
    assert trainer_command(["jobs.json"], nproc_per_node=4, endpoint="127.0.0.1:29555",
                           program=("-m", "trainer.engine.jobs")) == [
        PY, "-m", "torch.distributed.run", "--nproc_per_node=4", "--master_addr=127.0.0.1", "--master_port=29555",
        "-m", "trainer.engine.jobs", "jobs.json"]


def test_it_runs_one_process_without_a_launcher_when_asked():
    assert trainer_command(["--spec", "s.json"], launcher_for_one=False, python="python3") == [
        "python3", "-m", "trainer", "--spec", "s.json"]
    # a launcher still runs a world of one by default: the local launcher's jobs all look alike
    assert trainer_command(["--spec", "s.json"])[1:4] == ["-m", "torch.distributed.run", "--standalone"]


def test_it_starts_one_torchrun_per_node_with_c10d_rendezvous_under_srun():
    cmd = trainer_command(["--spec", "s.json", "--resume"], nproc_per_node=8, nodes=2, endpoint="node1:29500",
                          rdzv_id="4242", srun=True)
    assert cmd == ["srun", "--nodes=2", "--ntasks-per-node=1", PY, "-m", "torch.distributed.run", "--nnodes=2",
                   "--nproc_per_node=8", "--rdzv_backend=c10d", "--rdzv_endpoint=node1:29500", "--rdzv_id=4242",
                   "-m", "trainer", "--spec", "s.json", "--resume"]


def test_it_refuses_several_nodes_without_a_rendezvous_endpoint():
    with pytest.raises(ValueError, match="rendezvous endpoint"):
        trainer_command(["--spec", "s.json"], nproc_per_node=2, nodes=2)
    with pytest.raises(ValueError, match="at least 1"):
        trainer_command([], nproc_per_node=0)
