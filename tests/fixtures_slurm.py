"""A real Slurm on this machine: munged, slurmctld and two slurmd (nodes n1 and n2), on free ports.

Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them). The cluster has no accounting
database (``jobcomp/filetxt`` keeps finished jobs; ``squeue`` shows them for ``MinJobAge``), two
partitions (``main``, and ``urgent`` whose jobs preempt ``main``'s: ``PreemptMode=CANCEL`` ends
them ``PREEMPTED``), and notices a killed ``slurmd`` within a few seconds (``NODE_FAIL``).
One cluster serves a whole test module (``slurm_cluster`` is module-scoped); the module's tests
run in one xdist group, one after another. Clusters of two modules may run at once, on two
workers: each has its own ports, munged, folders, name and job ids (by worker), so that neither
the coordinator ports derived from job ids nor a test's search for a job's ``slurmstepd`` can
meet the other's.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import missing_tool, port_in_block, worker_index

NODES = ("n1", "n2")
CPUS = 2
MEMORY_MB = 8000
FIRST_JOB_ID = 14000
"""Job ids (and the coordinator ports derived from them, 20000 + id % 20000) clear of the SSH tests' ports;
worker N's cluster counts from ``FIRST_JOB_ID + 1000 * N``."""


_PORTS_PER_WORKER = 30
_FIRST_PORT = 9000  # up to 30 workers: 9000..9899, clear of the other fixtures' blocks
_ports = itertools.count()


def _free_port() -> int:
    # A port bound later by a daemon: one drawn by binding port 0 could be taken meanwhile by
    # any process drawing an ephemeral port (Ray's and gRPC's servers do, all the time).
    return port_in_block(_FIRST_PORT, _PORTS_PER_WORKER, _ports, "a Slurm daemon")


@dataclass
class SlurmCluster:
    """A running cluster: its folder, its ``slurm.conf``, the environment its commands need."""

    folder: Path
    conf: Path
    ports: dict[str, int]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> str:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{argv}: {done.stderr or done.stdout}")
        return done.stdout

    def jobs(self) -> dict[int, dict[str, str]]:
        """Every job squeue shows: id -> {state, reason, comment, nodes, name}."""
        out = self.run("squeue", "--states=all", "--noheader", "-O", "JobID:|,State:|,Reason:|,Comment:|,NodeList:|,Name:|")
        found = {}
        for line in out.splitlines():
            job, state, reason, comment, nodes, name = (p.strip() for p in line.split("|")[:6])
            found[int(job)] = {"state": state, "reason": reason, "comment": comment, "nodes": nodes, "name": name}
        return found

    def node_state(self, node: str) -> str:
        return self.run("sinfo", "--noheader", "-n", node, "-o", "%T").strip()

    def kill_node(self, node: str, job_id: int | None = None) -> None:
        """The node dies: its slurmd, and (as with a machine that is gone) the processes of ``job_id``
        it ran, SIGKILLed."""
        pid = int((self.folder / f"slurmd-{node}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2],
              10, f"slurmd of {node} gone")
        if job_id is not None:
            for stepd in _stepds(job_id):
                _kill_tree(stepd)

    def start_node(self, node: str) -> None:
        subprocess.run(["slurmd", "-N", node], env=self.env, check=True, timeout=60)
        _wait(lambda: self.node_state(node) in ("idle", "mixed", "allocated"), 60, f"node {node} back")
        # A slurmd just restarted answers the controller before it can launch a job's steps: a job
        # given it then had its step fail ("Zero Bytes were transmitted") and the next test saw a job
        # end that it never ended. As an operator would, one step run on the node proves it is back.
        _wait(lambda: self._launches(node), 60, f"node {node} launching steps")

    def _launches(self, node: str) -> bool:
        done = subprocess.run(["srun", f"--nodelist={node}", "--ntasks=1", "--cpus-per-task=1", "--immediate=10",
                               "--job-name=node-check", "true"], env=self.env, capture_output=True, timeout=60)
        return done.returncode == 0

    def cancel_all(self) -> None:
        self.run("scancel", "--user=root", check=False)
        _wait(lambda: not [j for j in self.jobs().values() if j["state"] in ("RUNNING", "PENDING", "COMPLETING")],
              60, "every job ended")


def _stepds(job_id: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if cmd.startswith("slurmstepd:") and f"[{job_id}." in cmd:
                found.append(int(entry))
    return found


def _kill_tree(pid: int) -> None:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo, every = [pid], []
    while todo:
        p = todo.pop()
        every.append(p)
        todo.extend(children.get(p, []))
    for p in every:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def _wait(ok, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _conf(folder: Path, ports: dict[str, int]) -> str:
    host = socket.gethostname()
    worker = worker_index()
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[n]} CPUs={CPUS} RealMemory={MEMORY_MB} State=UNKNOWN"
        for n in NODES
    )
    return f"""ClusterName=mbtest{worker}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports['ctld']}
AuthType=auth/munge
AuthInfo=socket={folder}/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=5
SlurmctldTimeout=10
MinJobAge=600
KillWait=2
InactiveLimit=0
MessageTimeout=5
FirstJobId={FIRST_JOB_ID + 1000 * worker}
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
SlurmdParameters=config_overrides
{nodes}
PartitionName=main Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes={','.join(NODES)} MaxTime=INFINITE State=UP PriorityTier=10
"""


def _stop_daemons(pidfiles: list[Path]) -> None:
    """SIGTERM every daemon named by ``pidfiles`` at once, then wait (30 s at most each) until each is gone."""
    pids = []
    for pidfile in pidfiles:
        try:
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue
        pids.append((pidfile, pid))
    for pidfile, pid in pids:
        try:
            _wait(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 30, f"{pidfile.name} ended")
        except AssertionError:
            pass


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel"):
        if shutil.which(tool) is None:
            missing_tool(f"{tool} not found: apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        missing_tool("the test Slurm runs its daemons as root")
    folder = tmp_path_factory.mktemp("slurm", numbered=True)
    for sub in ("state", "munge", *(f"spool/{n}" for n in NODES)):
        (folder / sub).mkdir(parents=True)
    (folder / "munge").chmod(0o755)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    ports = {"ctld": _free_port(), **{n: _free_port() for n in NODES}}
    conf = folder / "slurm.conf"
    conf.write_text(_conf(folder, ports))
    cluster = SlurmCluster(folder, conf, ports)
    m = folder / "munge"
    subprocess.run(["munged", "-f", f"--socket={m}/munge.sock", f"--key-file={key}", f"--log-file={m}/munged.log",
                    f"--pid-file={m}/munged.pid", f"--seed-file={m}/munged.seed"], check=True, timeout=30)
    try:
        subprocess.run(["slurmctld", "-i"], env=cluster.env, check=True, timeout=60)
        for n in NODES:
            subprocess.run(["slurmd", "-N", n], env=cluster.env, check=True, timeout=60)
        _wait(lambda: all(cluster.node_state(n) == "idle" for n in NODES), 60, "both nodes idle")
        yield cluster
    finally:
        try:
            cluster.cancel_all()
        except Exception:  # a broken cluster is torn down all the same
            pass
        # The Slurm daemons stop side by side (each takes a second or two); munged, which
        # they may still ask on the way out, once they are gone.
        for pidfiles in ([*(folder / f"slurmd-{n}.pid" for n in NODES), folder / "slurmctld.pid"], [m / "munged.pid"]):
            _stop_daemons(pidfiles)
