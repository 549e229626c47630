"""A real two-node Slurm cluster on this one machine, built and torn down by the tests.

Slurm 22.05 from this machine's Debian 12, or 24.11 from Debian 13 (``release``): slurmctld on the host, two slurmd
(nodes ``n1`` and ``n2``, 8 CPUs and 2 fake GPUs each),
each in its own network namespace on a private bridge, and slurmrestd on 127.0.0.1 with JWT tokens. Everything the
cluster writes (its configuration, state, spool, logs, pid files and JWT key) lies in one fresh temporary folder that
``stop()`` removes. munged is the machine's own: started if none runs, and left running (another cluster beside this
one may use it), as the test command leaves Redis.

Every namespace names its end of the network ``wb0`` (``SlurmCluster.interface``), so a job sets
``GLOO_SOCKET_IFNAME=wb0`` whichever node it lands on. Inside a namespace 127.0.0.1 is that namespace's own
loopback: a job cannot reach a service the host offers on 127.0.0.1 (Redis, PostgreSQL); the host is at
``SlurmCluster.host_address``.

All nodes share the machine's host name, which /etc/hosts maps to a loopback address, so a program that finds
"its" address from the host name gets the loopback on every node. What that means for torchrun is written at
``TORCHRUN_ACROSS_NODES`` in tests/workers/launchers/test_slurm_cluster.py.

Slurm 24.11 runs from a Debian 13 root that ``debootstrap`` builds from Debian's packages once per machine (about
two minutes; ``ensure_slurm_root``, kept under ~/.cache/llm-workbench/). Its daemons and commands run in a mount
namespace of their own where that root's /usr is mounted over /usr: slurmd starts 24.11's slurmstepd, and the jobs
still see this machine's /root, /tmp and checkout (programs built for Debian 12 run on Debian 13's newer libraries).
The cluster's ``bin/`` holds sbatch, squeue, scancel, scontrol, sacct, sacctmgr, sinfo and srun doing the same:
``env`` puts it first on PATH, so code under test that calls the commands reaches 24.11.

The 24.11 cluster keeps accounting (``accounting``): slurmdbd from its root over this machine's MariaDB server (a
database folder in the cluster's folder, a free port of 127.0.0.1), registered with sacctmgr before slurmctld
starts; each step's memory is sampled every second, so sacct answers with steps, exit codes, times and MaxRSS.

Needs root (namespaces, a bridge, daemons running as root). ``unavailable_reason()`` says why a machine cannot run
it; anything else that stops the cluster from starting raises ``SlurmClusterError`` with the daemons' log tails.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "slurmrestd", "slurm-wlm-jwt-plugin", "mariadb-server")
PROGRAMS = ("/usr/bin/sbatch", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/sbin/slurmrestd",
            "/usr/sbin/mariadbd")
# Debian puts the plugin in its multiarch folder (x86_64-linux-gnu, aarch64-linux-gnu, ...).
JWT_PLUGIN_GLOB = "/usr/lib/*/slurm-wlm/auth_jwt.so"
POLICY_RC = Path("/usr/sbin/policy-rc.d")
MUNGE_KEY = Path("/etc/munge/munge.key")
REST_VERSIONS = {"22.05": "v0.0.38", "24.11": "v0.0.42"}  # the newest each release's slurmrestd serves
# Releases that run from a Debian root of their own: the Debian suite, and the packages of the root.
ROOT_SUITES = {"24.11": "trixie"}
ROOT_PACKAGES = ("slurmctld", "slurmd", "slurmrestd", "slurm-client", "munge", "slurm-wlm-jwt-plugin",
                 "slurmdbd",  # accounting, over this machine's MariaDB (Debian 13's 11.8 breaks slurmdbd 24.11)
                 "libffi8")  # the last: what this machine's Python needs besides the base system, for the jobs
ROOTS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llm-workbench"
COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "sacct", "sacctmgr", "sinfo", "srun")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
START_TIMEOUT_S = 60
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE",
            "BOOT_FAIL")


class SlurmClusterError(RuntimeError):
    """The cluster could not start (or stop) on a machine that should run it."""


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # the cgroup-v1 CPU controller, where this machine mounts it


def _run(args: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise SlurmClusterError(f"{' '.join(args)} exited with {result.returncode}: {result.stderr.strip()}")
    return result


# ---------------------------------------------------------------------------------------------------------------
# Installing


def missing_parts() -> list[str]:
    """The Slurm programs and plugin this machine lacks."""
    missing = [path for path in PROGRAMS if not os.access(path, os.X_OK)]
    if not glob.glob(JWT_PLUGIN_GLOB):
        missing.append(JWT_PLUGIN_GLOB)
    return missing


def ensure_slurm_installed() -> None:
    """Install the Debian packages if any part is missing (root only; scripts/setup-env.sh does the same)."""
    if not missing_parts():
        return
    # No daemon may start from the package scripts: the cluster starts its own, with its own configuration.
    created_policy = not POLICY_RC.exists()
    if created_policy:
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        _run(["apt-get", "update", "-qq"], env=env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES], env=env)
    finally:
        if created_policy:
            POLICY_RC.unlink(missing_ok=True)
    if missing_parts():
        raise SlurmClusterError(f"installed {' '.join(PACKAGES)} but still missing: {', '.join(missing_parts())}")


def slurm_root(release: str) -> Path:
    """Where ``release``'s root is cached; named by its packages too, so that a root built with fewer is not used."""
    packages = hashlib.sha256(" ".join(ROOT_PACKAGES).encode()).hexdigest()[:8]
    return ROOTS / f"slurm-{release}-root-{packages}"


def ensure_slurm_root(release: str) -> Path:
    """The Debian root ``release`` runs from, built with debootstrap if missing (once per machine: a lock keeps a
    second test process from building it at the same time, and a root is only ever seen whole)."""
    from filelock import FileLock

    root = slurm_root(release)
    ROOTS.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{root}.lock"):
        if (root / "usr" / "sbin" / "slurmctld").exists():
            return root
        if not shutil.which("debootstrap"):
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            _run(["apt-get", "update", "-qq"], env=env)
            _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "debootstrap"], env=env)
        building = root.with_name(root.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(ROOT_PACKAGES)}", ROOT_SUITES[release],
              str(building), DEBIAN_MIRROR], timeout=900)
        building.rename(root)
    return root


def in_root(usr: Path | None, hosts: Path | None, args: list[str]) -> list[str]:
    """``args`` run with ``usr`` mounted over /usr and ``hosts`` over /etc/hosts, in a mount namespace of their own
    (as they are without ``usr``)."""
    if usr is None:
        return args
    mounts = 'mount --bind "$0" /usr && mount --bind "$1" /etc/hosts && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mounts, str(usr), str(hosts), *args]


def unavailable_reason() -> str | None:
    """Why this machine cannot run the cluster at all (a reason to skip), or None."""
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (network namespaces, a bridge, slurmd as root)"
    if not shutil.which("ip") or not shutil.which("nsenter"):
        return "a Slurm cluster needs the ip and nsenter commands"
    probe = f"wb{os.getpid()}p"
    result = _run(["ip", "netns", "add", probe], check=False)
    if result.returncode != 0:
        return f"network namespaces are not permitted here: {result.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    if missing_parts() and not shutil.which("apt-get"):
        return f"Slurm is not installed and there is no apt-get to install it ({', '.join(missing_parts())})"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Processes


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped by its parent) does not count, where kill -0 says yes."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return fields.rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # the state follows the (command name)


def _stop_processes(processes: list[subprocess.Popen], timeout: float) -> None:
    """SIGTERM all of them at once, then SIGKILL whatever is still running after ``timeout`` seconds."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _free_port(host: str = "") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _munge_answers() -> bool:
    return subprocess.run(["munge", "-n"], capture_output=True).returncode == 0


def ensure_munged() -> None:
    """A munge key and a running munged (the machine's; one may already run for something else)."""
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        _run(["mungekey", "--create", "--keyfile", str(MUNGE_KEY)])
        shutil.chown(MUNGE_KEY, "munge", "munge")
        MUNGE_KEY.chmod(0o600)
    if _munge_answers():
        return
    # /run is empty after a boot without systemd: munged wants its socket folder, owned by munge.
    for folder in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, "munge", "munge")
    _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
    deadline = time.monotonic() + 10
    while not _munge_answers():
        if time.monotonic() > deadline:
            raise SlurmClusterError("munged started but does not answer `munge -n`")
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------------------------
# The network: one namespace per node on a bridge


def _used_subnets() -> set[str]:
    out = _run(["ip", "-4", "-o", "addr", "show"]).stdout
    return {".".join(address.split(".")[:3]) for address in re.findall(r"inet (\d+\.\d+\.\d+)\.\d+/", out)}


def _pick_subnet() -> str:
    """A 10.213.<x> /24 no interface of this machine uses: another cluster may be running beside this one."""
    used = _used_subnets()
    for step in range(250):
        subnet = f"10.213.{(os.getpid() + step) % 250 + 1}"
        if subnet not in used:
            return subnet
    raise SlurmClusterError("every 10.213.x.0/24 subnet is in use on this machine")


def remove_stale_networks() -> None:
    """Delete the namespaces, bridges and CPU cgroups of clusters whose test process died without stopping them."""
    names = _run(["ip", "netns", "list"]).stdout.split()
    links = _run(["ip", "-o", "link", "show"]).stdout
    for name in set(names) | set(re.findall(r"^\d+: (wb\d+br\d?)[:@]", links, re.M)):
        match = re.fullmatch(r"wb(\d+)(?:[a-h]|br\d?)", name)
        if match and not _alive(int(match.group(1))):
            _delete_link_or_namespace(name)
    for group in CPU_CGROUP.glob("workbench-test-wb*"):  # emptied above: its processes were the namespaces'
        match = re.fullmatch(r"workbench-test-wb(\d+)br\d?", group.name)
        if match and not _alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                group.rmdir()


def _delete_link_or_namespace(name: str) -> None:
    if re.search(r"br\d?$", name):
        _run(["ip", "link", "del", name], check=False)
        return
    for pid in _run(["ip", "netns", "pids", name], check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    _run(["ip", "netns", "del", name], check=False)


class Network:
    """A bridge on the host (``<subnet>.1``) and one namespace per node (``<subnet>.11``, ``.12``, ...)."""

    def __init__(self, nodes: list[str], interface: str, index: int = 0):
        """``index``: which of the clusters of this process (each has its own bridge and namespaces)."""
        tag = f"wb{os.getpid()}"
        self.bridge = f"{tag}br{index or ''}"
        self.namespaces = {node: f"{tag}{chr(ord('a') + 2 * index + i)}" for i, node in enumerate(nodes)}
        self.interface = interface
        self.subnet = _pick_subnet()
        self.host_address = f"{self.subnet}.1"
        self.addresses = {node: f"{self.subnet}.{11 + i}" for i, node in enumerate(nodes)}

    def create(self) -> None:
        self.delete()  # what a crashed earlier process with this pid may have left
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.host_address}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for node, namespace in self.namespaces.items():
            _run(["ip", "netns", "add", namespace])
            inside = ["ip", "-n", namespace]
            _run([*inside, "link", "set", "lo", "up"])
            # The host end is named after the namespace; the inside end has the same name in every namespace.
            host_end = f"{namespace}h"
            _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", self.interface, "netns", namespace])
            _run(["ip", "link", "set", host_end, "master", self.bridge, "up"])
            _run([*inside, "addr", "add", f"{self.addresses[node]}/24", "dev", self.interface])
            _run([*inside, "link", "set", self.interface, "up"])

    def command(self, node: str, args: list[str]) -> list[str]:
        """``args`` run in the node's namespace: nsenter changes the network only (``ip netns exec`` would also
        remount /sys without the cgroup file system, and slurmd 22.05 then exits)."""
        return ["nsenter", f"--net=/run/netns/{self.namespaces[node]}", *args]

    def delete(self) -> None:
        for namespace in self.namespaces.values():
            _delete_link_or_namespace(namespace)  # the host end of its veth pair goes with it
        _delete_link_or_namespace(self.bridge)


# ---------------------------------------------------------------------------------------------------------------
# The cluster


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no file)"
    return "\n".join(text[-lines:])


# The QOS of the clusters with accounting: a job of PREEMPTING preempts jobs of PREEMPTIBLE, which have GRACE_S
# seconds from their SIGTERM to save and end
PREEMPTIBLE, PREEMPTING, GRACE_S = "low", "high", 30
# The accounting cluster's partition of little memory a job (each CPU's): its jobs go over it sooner
SMALL_MEMORY, SMALL_MEMORY_MB = "small", 1100


class SlurmCluster:
    """slurmctld, one slurmd per node (each in its namespace) and slurmrestd, in a fresh temporary folder.

    Use as a context manager, or ``start()`` then ``stop()``. Slurm commands need ``env`` (SLURM_CONF) merged into
    their environment; ``run()`` does that.
    """

    partition = "debug"
    interface = "wb0"
    cpus_per_node = 8  # more than the machine has (config_overrides): 16 one-CPU jobs run at once
    memory_per_node_mb = 64000  # declared, as the CPUs are: 8 GB a one-CPU job unless it asks

    def __init__(self, nodes: tuple[str, ...] = ("n1", "n2"), gpus_per_node: int = 2, release: str = "22.05",
                 accounting: bool | None = None):
        if release not in REST_VERSIONS:
            raise SlurmClusterError(f"no test cluster of Slurm {release}: {', '.join(REST_VERSIONS)}")
        # slurmdbd over MariaDB, so that sacct answers: by default where the release's root carries them
        self.accounting = release in ROOT_SUITES if accounting is None else accounting
        if self.accounting and release not in ROOT_SUITES:
            raise SlurmClusterError(f"accounting runs from a release's own root: {', '.join(ROOT_SUITES)}")
        self.release = release
        self.rest_version = REST_VERSIONS[release]
        # /usr of the release's own root (None: this machine's Slurm)
        self.usr = slurm_root(release) / "usr" if release in ROOT_SUITES else None
        self.nodes = list(nodes)
        # Fake GPUs: character devices that are /dev/null underneath, so that --gres=gpu:<k> is accepted and
        # sets CUDA_VISIBLE_DEVICES, as on a GPU cluster.
        self.gpus_per_node = gpus_per_node
        self.root: Path | None = None
        self.network: Network | None = None
        self.rest_port: int | None = None
        self._controller: subprocess.Popen | None = None
        self._node_daemons: list[subprocess.Popen] = []
        self._rest: subprocess.Popen | None = None
        self._database: subprocess.Popen | None = None
        self._dbd: subprocess.Popen | None = None
        self.dbd_port: int | None = None
        self.startup_s: float | None = None
        self.slurmd_timeout_s = 10 if self.accounting else 30

    # -- what tests use

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a process that calls Slurm commands needs in its environment (and PATH, for a release of its own
        root: its commands first)."""
        if self.usr is None:
            return {"SLURM_CONF": str(self.conf)}
        return {"SLURM_CONF": str(self.conf), "PATH": f"{self.root / 'bin'}:{os.environ.get('PATH', '')}"}

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def node_addresses(self) -> dict[str, str]:
        return dict(self.network.addresses)

    @property
    def host_address(self) -> str:
        return self.network.host_address

    def run(self, args: list[str], check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """A command with the cluster's environment, its output captured as text."""
        env = {**os.environ, **self.env, **kwargs.pop("env", {})}
        result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, **kwargs)
        if check and result.returncode != 0:
            raise SlurmClusterError(f"{' '.join(map(str, args))} exited with {result.returncode}:\n"
                                    f"{result.stdout}{result.stderr}")
        return result

    def sbatch(self, *args: str) -> int:
        """Submit a batch job (``sbatch --parsable <args>``); its id."""
        return int(self.run(["sbatch", "--parsable", *args]).stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Reason, ExitCode, NodeList, ...) for a job."""
        line = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)]).stdout.strip()
        # Values may hold spaces (Comment, Command): a value runs up to the next " Key=".
        return {key: value.strip() for key, value in re.findall(r"([\w/:]+)=(.*?)(?= [\w/:]+=|$)", line)}

    def wait_for_job(self, job_id: int, states: tuple[str, ...] = FINISHED, timeout: float = 60) -> dict[str, str]:
        """The job's fields once its state is one of ``states`` (by default: finished, whichever way)."""
        deadline = time.monotonic() + timeout
        while (job := self.job(job_id))["JobState"] not in states:
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"job {job_id} is still {job['JobState']} ({job['Reason']}) after "
                                        f"{timeout} s, not {'/'.join(states)}\n{self.logs_tail()}")
            time.sleep(0.1)
        return job

    def rest(self, method: str, path: str, body: dict | None = None, user: str = "root",
             token: str | None = None) -> tuple[int, dict]:
        """A slurmrestd request as ``user``, with a fresh token unless one is given (``""``: no token header): its
        status and JSON body. ``path`` follows /slurm/<version>/: ``ping``, ``jobs``, ``job/submit``, ``job/12``."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"X-SLURM-USER-NAME": user, "Content-Type": "application/json"}
        if token != "":
            headers["X-SLURM-USER-TOKEN"] = self.token(user) if token is None else token
        request = urllib.request.Request(f"{self.rest_url}/slurm/{self.rest_version}/{path}", data=data, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                return error.code, json.loads(text)
            except ValueError:  # a refused token is answered in plain text ("Authentication failure")
                return error.code, {"text": text}

    def fail_node(self, node: str) -> None:
        """``node`` dies at once, as at a power loss: its slurmd and every process in its namespace (the steps and
        tasks of its jobs) are killed. slurmctld learns of it only when the node stops answering (SlurmdTimeout)."""
        pids = _run(["ip", "netns", "pids", self.network.namespaces[node]]).stdout.split()
        for pid in map(int, pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._node_daemons[self.nodes.index(node)].wait(timeout=10)

    @contextlib.contextmanager
    def jobs_at_lowest_priority(self):
        """Within: every process of the nodes (their slurmd, and so every job it starts) in a CPU cgroup of the lowest
        weight (cpu.shares 2, against 1024 for everything else). The nodes share this machine's cores with the web and
        its database, where on a site they are other machines; so weighted, they take only the cores the rest leaves.
        A cgroup, not a nice value: the kernel's autogroup scheduling gives each job's session an equal share of the
        CPU whatever its nice value. Without the cgroup-v1 CPU controller the nodes are left as they are."""
        if not (CPU_CGROUP / "cpu.shares").exists():
            yield
            return
        group = CPU_CGROUP / f"workbench-test-{self.network.bridge}"
        group.mkdir(exist_ok=True)
        (group / "cpu.shares").write_text("2")
        try:
            for node in self.nodes:
                for pid in _run(["ip", "netns", "pids", self.network.namespaces[node]]).stdout.split():
                    with contextlib.suppress(OSError):  # gone meanwhile
                        (group / "cgroup.procs").write_text(pid)
            yield
        finally:
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (CPU_CGROUP / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                group.rmdir()

    def restore_node(self, node: str, timeout: float = 60) -> None:
        """``node`` back: its slurmd started again, and up once it has registered (ReturnToService=2): idle, or
        already running a job the scheduler gave it."""
        daemon = self._node_daemons[self.nodes.index(node)]
        if daemon.poll() is None:
            return
        self._node_daemons[self.nodes.index(node)] = self._daemon(
            ["/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf)], f"slurmd-{node}.out", node=node)
        deadline = time.monotonic() + timeout
        while True:
            state = self.run(["sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%t"]).stdout.split()[0]
            if state in ("idle", "mix", "alloc"):
                return
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"{node} is {state} {timeout:.0f} s after its slurmd started again")
            time.sleep(0.5)

    def token(self, user: str = "root", lifespan: int = 3600) -> str:
        """A JWT for slurmrestd (header X-SLURM-USER-TOKEN, with X-SLURM-USER-NAME: ``user``)."""
        out = self.run(["scontrol", "token", f"username={user}", f"lifespan={lifespan}"]).stdout
        return out.strip().split("=", 1)[1]

    def logs_tail(self, lines: int = 25) -> str:
        """The last lines of every daemon's log, for error messages."""
        if self.root is None:
            return "(no cluster folder)"
        return "\n".join(f"--- {path.name}\n{_tail(path, lines)}" for path in sorted((self.root / "log").glob("*")))

    # -- starting

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        try:
            self._start()
        except BaseException as exc:
            logs = self.logs_tail()
            self.stop()
            if isinstance(exc, SlurmClusterError):
                raise SlurmClusterError(f"{exc}\n{logs}") from None
            raise
        self.startup_s = time.monotonic() - started

    def _start(self) -> None:
        ensure_munged()
        remove_stale_networks()
        # World-readable: slurmrestd runs as nobody and reads slurm.conf; the JWT key alone is root's.
        self.root = Path(tempfile.mkdtemp(prefix="wb-slurm-"))
        self.root.chmod(0o755)
        for folder in ("etc", "state", "spool", "log", "run"):
            (self.root / folder).mkdir()
        self.network = Network(self.nodes, self.interface, index=list(REST_VERSIONS).index(self.release))
        self.network.create()
        self._make_commands()
        self._make_gpus()
        self._write_config()
        if self.accounting:
            self._start_accounting()
        self._start_daemons()
        self._wait_until_ready()

    @property
    def hosts(self) -> Path:
        return self.root / "etc" / "hosts"

    def _make_commands(self) -> None:
        """bin/<command> for each Slurm command, with the release's /usr (none for this machine's Slurm); and the
        hosts file they and the daemons read. slurmctld 24.11 looks up the name of every address that connects to it,
        and a name server that drops one query in a few dozen holds that request for the resolver's 5 s, past
        Slurm's MessageTimeout: with the cluster's addresses in the hosts file no query is sent."""
        if self.usr is None:
            return
        names = [f"{self.network.host_address} wb-host"] + [f"{a} {n}" for n, a in self.network.addresses.items()]
        self.hosts.write_text(Path("/etc/hosts").read_text() + "\n".join(names) + "\n")
        (self.root / "bin").mkdir()
        for command in COMMANDS:
            wrapper = self.root / "bin" / command
            words = in_root(self.usr, self.hosts, [f"/usr/bin/{command}"])
            wrapper.write_text(f"#!/bin/sh\nexec {shlex.join(words)} \"$@\"\n")
            wrapper.chmod(0o755)

    def _make_gpus(self) -> None:
        (self.root / "dev").mkdir()
        for index in range(self.gpus_per_node):
            os.mknod(self.root / "dev" / f"gpu{index}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))

    def _gpu_config(self) -> tuple[list[str], str]:
        """The GresTypes line (none without GPUs), and the node line's Gres field; writes gres.conf."""
        if not self.gpus_per_node:
            return [], ""
        last = self.gpus_per_node - 1
        files = f"{self.root}/dev/gpu[0-{last}]" if last else f"{self.root}/dev/gpu0"
        (self.root / "etc" / "gres.conf").write_text(f"NodeName={','.join(self.nodes)} Name=gpu File={files}\n")
        return ["GresTypes=gpu"], f" Gres=gpu:{self.gpus_per_node}"

    def _write_config(self) -> None:
        key = self.root / "etc" / "jwt.key"
        key.touch(mode=0o600)
        key.write_bytes(secrets.token_bytes(32))  # slurmctld refuses a key others can read, and wants SlurmUser's
        root = self.root
        gres_types, node_gres = self._gpu_config()
        lines = [
            "ClusterName=workbench",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.network.host_address})",
            f"SlurmctldPort={_free_port()}",  # another cluster may be running beside this one
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthAltTypes=auth/jwt",
            f"AuthAltParameters=jwt_key={key}",
            f"StateSaveLocation={root}/state",
            f"SlurmctldPidFile={root}/run/slurmctld.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log",
            # %n: the node's name, so that the nodes' slurmd (MULTIPLE_SLURMD) keep apart on one file system
            f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmdPidFile={root}/run/slurmd-%n.pid",
            f"SlurmdLogFile={root}/log/slurmd-%n.log",
            *self._accounting_config(),
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            *self._memory_config(),
            "SchedulerParameters=batch_sched_delay=0",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={root}/log/jobcomp.txt",
            "MinJobAge=3600",  # finished jobs stay in `scontrol show job` (without accounting, all there is)
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",  # the nodes declare more CPUs and memory than the machine has
            "SlurmctldTimeout=10",
            # how long a node may be silent before it is down and its jobs NODE_FAIL: short where a test fails a node
            f"SlurmdTimeout={self.slurmd_timeout_s}",
            "MessageTimeout=5",
            "KillWait=5",  # seconds between SIGTERM and SIGKILL when a job is cancelled or runs out of time
            "InactiveLimit=0",
            "MailProg=/bin/true",  # Debian names a mailer it does not install; slurmctld complains at each start
            *gres_types,
            *(f"NodeName={node} NodeAddr={address} CPUs={self.cpus_per_node} RealMemory={self.memory_per_node_mb}"
              f"{node_gres} State=UNKNOWN" for node, address in self.network.addresses.items()),
            f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP",
            # a partition of each node alone, for a test that must place a job on a node of its choosing
            *(f"PartitionName={node} Nodes={node} MaxTime=INFINITE State=UP" for node in self.nodes),
            # where a job's memory is its limit (with accounting): a partition whose jobs get little of it
            *([f"PartitionName={SMALL_MEMORY} Nodes={','.join(self.nodes)} DefMemPerCPU={SMALL_MEMORY_MB} "
               f"MaxTime=INFINITE State=UP"] if self.accounting else []),
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        self.conf.chmod(0o644)
        # A private folder above the temporary one (TMPDIR) would leave slurmrestd unable to read its configuration.
        if _run(["runuser", "-u", "nobody", "--", "test", "-r", str(self.conf)], check=False).returncode != 0:
            raise SlurmClusterError(f"{self.conf} is not readable by nobody, slurmrestd's user: is TMPDIR private?")

    def _daemon(self, args: list[str], log: str, node: str | None = None, own_usr: bool = True,
                **env) -> subprocess.Popen:
        """A daemon in the foreground (in ``node``'s namespace; from the release's root unless not ``own_usr``), as
        a child of this process: stopping it is a terminate and a wait."""
        command = in_root(self.usr, self.hosts, args) if own_usr else args
        with open(self.root / "log" / log, "ab") as out:
            return subprocess.Popen(self.network.command(node, command) if node else command, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **self.env, **env}, start_new_session=True)

    def _start_daemons(self) -> None:
        conf = str(self.conf)
        self._controller = self._daemon(["/usr/sbin/slurmctld", "-D", "-i", "-f", conf], "slurmctld.out")
        for node in self.nodes:
            self._node_daemons.append(self._daemon(
                ["/usr/sbin/slurmd", "-D", "-N", node, "-f", conf], f"slurmd-{node}.out", node=node))
        # slurmrestd refuses to run as root; SLURM_JWT=daemon makes it pass each request's token to slurmctld.
        self.rest_port = _free_port("127.0.0.1")
        self._rest = self._daemon(
            ["/usr/sbin/slurmrestd", "-f", conf, "-u", "nobody", "-g", "nogroup", "-s",
             ("openapi/slurmctld,openapi/slurmdbd" if self.accounting else "openapi/slurmctld") if self.usr
             else f"openapi/{self.rest_version}",
             "-a", "rest_auth/jwt", f"127.0.0.1:{self.rest_port}"], "slurmrestd.log", SLURM_JWT="daemon")

    def _memory_config(self) -> list[str]:
        """With accounting, memory is a resource each job holds (DefMemPerCPU a CPU unless it asks), and a step that
        goes over its job's is killed: slurmstepd reads each task's memory every second (OverMemoryKill) and says
        so in the job's output. Without accounting, CPUs alone.

        Memory cgroups (task/cgroup with ConstrainRAMSpace, on this machine's cgroup v1) enforce the same limit
        through the kernel's OOM killer and work here for one job, but with them (and proctrack/cgroup) the
        multi-rank tests stalled after a frozen rank's job was killed under load; the workbench reads both ways."""
        if not self.accounting:
            return ["SelectTypeParameters=CR_Core", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]
        return ["SelectTypeParameters=CR_Core_Memory", f"DefMemPerCPU={self.memory_per_node_mb // self.cpus_per_node}",
                "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherParams=OverMemoryKill"]

    def _accounting_config(self) -> list[str]:
        """slurm.conf's accounting lines: through slurmdbd, with each step's memory and CPU sampled every second
        (MaxRSS, for a step of a few seconds too); or none gathered."""
        if not self.accounting:
            return ["JobAcctGatherType=jobacct_gather/none"]
        self.dbd_port = _free_port()
        return ["AccountingStorageType=accounting_storage/slurmdbd",
                f"AccountingStorageHost={self.network.host_address}", f"AccountingStoragePort={self.dbd_port}",
                "JobAcctGatherType=jobacct_gather/linux", "JobAcctGatherFrequency=task=1",
                # QOS-based preemption (the QOS live in slurmdbd): a job of QOS PREEMPTING takes the CPUs of jobs
                # of QOS PREEMPTIBLE, which get SIGTERM and are cancelled GRACE_S later
                "PreemptType=preempt/qos", "PreemptMode=CANCEL"]

    def _start_accounting(self) -> None:
        """MariaDB (a database folder of the cluster's own, on a free port of 127.0.0.1) and slurmdbd over it, then
        the cluster registered with sacctmgr, before slurmctld starts and reports to it."""
        database, sock, db_port = self.root / "db", self.root / "run" / "mysqld.sock", _free_port("127.0.0.1")
        # MariaDB is this machine's (Debian 12's 10.11): slurmdbd 24.11 fails on Debian 13's MariaDB 11.8 server
        # ("Number of columns in result … exceeds maximum allowed number of columns (=0)" at its first query)
        _run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={database}", "--skip-test-db"],
             timeout=120)
        self._database = self._daemon(
            ["mariadbd", "--no-defaults", "--user=root", f"--datadir={database}", f"--socket={sock}",
             f"--port={db_port}", "--bind-address=127.0.0.1", "--skip-name-resolve", "--innodb-buffer-pool-size=32M",
             f"--pid-file={self.root / 'run' / 'mysqld.pid'}"], "mariadbd.log", own_usr=False)
        password = secrets.token_hex(8)
        grant = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                 f"GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        client = ["mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e", grant]
        self._until(lambda: _run(client, check=False).returncode == 0, "MariaDB does not take its first user",
                    [self._database])
        dbd_conf = self.root / "etc" / "slurmdbd.conf"  # slurmdbd reads it beside SLURM_CONF; root's alone
        dbd_conf.touch(mode=0o600)
        dbd_conf.write_text("\n".join([
            "DbdHost=localhost", f"DbdPort={self.dbd_port}", "SlurmUser=root", "AuthType=auth/munge",
            "AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={self.root / 'etc' / 'jwt.key'}",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={db_port}",
            "StorageUser=slurm", f"StoragePass={password}", "StorageLoc=slurm_acct_db",
            f"LogFile={self.root / 'log' / 'slurmdbd.log'}", f"PidFile={self.root / 'run' / 'slurmdbd.pid'}"]) + "\n")
        self._dbd = self._daemon(["/usr/sbin/slurmdbd", "-D"], "slurmdbd.out")

        def registered() -> bool:
            self.run(["sacctmgr", "--immediate", "add", "cluster", "workbench"], check=False)
            listed = self.run(["sacctmgr", "--noheader", "--parsable2", "list", "cluster", "format=Cluster"],
                              check=False)
            return "workbench" in listed.stdout.split()

        self._until(registered, "slurmdbd does not register the cluster", [self._database, self._dbd])
        for qos in ([PREEMPTIBLE, f"GraceTime={GRACE_S}", "PreemptMode=cancel"],
                    [PREEMPTING, f"Preempt={PREEMPTIBLE}"]):
            self.run(["sacctmgr", "--immediate", "add", "qos", *qos])

    def _until(self, done, what: str, daemons: list[subprocess.Popen]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not done():
            for process in daemons:
                if process.poll() is not None:
                    raise SlurmClusterError(f"{what}: {' '.join(map(str, process.args))} exited with "
                                            f"{process.returncode}")
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"{what} within {START_TIMEOUT_S} s")
            time.sleep(0.2)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._nodes_idle():
            self._check_daemons_alive()
            if time.monotonic() > deadline:
                states = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
                raise SlurmClusterError(f"the nodes are not idle after {START_TIMEOUT_S} s: "
                                        f"{states.stdout.strip()} {states.stderr.strip()}")
            time.sleep(0.2)
        token = self.token()
        while not self._rest_answers(token):
            self._check_daemons_alive()
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"slurmrestd does not answer GET "
                                        f"{self.rest_url}/slurm/{self.rest_version}/ping")
            time.sleep(0.2)

    def _nodes_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
        return dict(line.split() for line in out.splitlines()) == {node: "idle" for node in self.nodes}

    def _rest_answers(self, token: str) -> bool:
        request = urllib.request.Request(f"{self.rest_url}/slurm/{self.rest_version}/ping",
                                         headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status == 200 and "errors" in json.load(response)
        except OSError:
            return False

    def _check_daemons_alive(self) -> None:
        for process in [self._controller, *self._node_daemons, self._rest]:
            if process.poll() is not None:
                raise SlurmClusterError(f"{' '.join(process.args)} exited with {process.returncode}")

    # -- stopping

    def stop(self) -> None:
        """Cancel every job, stop the daemons (node daemons first), delete the network and the folder."""
        if self._controller is not None and self._controller.poll() is None:
            self._cancel_all_jobs()
        if self._rest is not None:
            _stop_processes([self._rest], timeout=5)
        # A slurmd whose slurmctld has gone can take over 10 s to leave on SIGTERM: stop the nodes first.
        _stop_processes(self._node_daemons, timeout=20)
        if self._controller is not None:
            _stop_processes([self._controller], timeout=20)
        _stop_processes([p for p in (self._dbd, self._database) if p is not None], timeout=20)
        if self.network is not None:
            self.network.delete()  # also kills whatever a job left running in a namespace
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self._controller, self._node_daemons, self._rest = None, [], None
        self._dbd = self._database = None
        self.network = self.root = None

    def _cancel_all_jobs(self) -> None:
        jobs = self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        if not jobs:
            return
        self.run(["scancel", *jobs], check=False)
        deadline = time.monotonic() + 15  # KillWait plus a little
        while time.monotonic() < deadline:
            if not self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split():
                return
            time.sleep(0.2)
