"""A Slurm cluster of two nodes on this one host, for the ``slurm`` test tier.

Debian's ``slurm-wlm`` and ``munge``, without systemd (the recipe of the shared SLURM.md notes):
a private state folder holds ``slurm.conf``, munge's key and socket, the daemons' pid files,
logs and spools. Every Slurm command finds the cluster through ``SLURM_CONF`` (the ``env`` of
:class:`LocalSlurm`), so nothing global changes but the ``n1``/``n2`` aliases of 127.0.0.1 in
``/etc/hosts`` (Slurm refuses two nodes with one host name). The daemons are stopped by the
pids their own pid files hold, never by name.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["LocalSlurm", "missing_slurm", "TERMINAL_STATES"]

#: The daemons and commands the tier needs.
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "srun", "squeue",
            "scancel")
#: Job states a job does not leave by itself.
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                             "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})
NODES = ("n1", "n2")
#: CPUs each node offers (Slurm is told to trust this count: two nodes share this host's cores).
CPUS_PER_NODE = 2


def missing_slurm() -> str | None:
    """Why the tier cannot run here (None: it can)."""
    absent = [p for p in PROGRAMS if shutil.which(p) is None]
    if absent:
        return (f"Slurm is not installed ({', '.join(absent)} missing): "
                "apt-get install -y slurm-wlm munge")
    if os.geteuid() != 0:
        return "the local Slurm runs its daemons as root: run the slurm tier as root"
    return None


def _free_ports(count: int, low: int = 20000, high: int = 30000) -> list[int]:
    """``count`` ports free now in ``[low, high)``: outside Ray's worker ports (10002-19999)
    and the kernel's ephemeral range."""
    ports: list[int] = []
    for port in range(low + (os.getpid() * 7) % 5000, high):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"no {count} free ports in [{low}, {high})")


class LocalSlurm:
    """Slurm's controller and two ``slurmd`` (``n1``, ``n2``) with a private ``munged``.

    Args:
        root: the private state folder (created).
        kill_wait: seconds between a step's SIGTERM and its SIGKILL (Slurm's ``KillWait``).
    """

    def __init__(self, root: Path, kill_wait: int = 30) -> None:
        self.root = Path(root)
        self.kill_wait = kill_wait
        self.conf = self.root / "slurm.conf"
        self.env: dict[str, str] = dict(os.environ, SLURM_CONF=str(self.conf))
        self._pid_files: list[Path] = []

    # ------------------------------------------------------------------------ start and stop
    def start(self, deadline_s: float = 60.0) -> None:
        """Starts munged, slurmctld and both slurmd, then waits (``deadline_s``) until ``sinfo``
        shows both nodes idle.

        Raises:
            RuntimeError: a daemon did not start, or the nodes were not idle in time (the
                daemons started are stopped first).
        """
        for sub in ("state", "spool/n1", "spool/n2", "run", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self._hosts()
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        run, log = self.root / "run", self.root / "log"
        ctld, *slurmd = _free_ports(1 + len(NODES))
        self.conf.write_text(self._conf(ctld, slurmd))
        try:
            self._daemon(run / "munged.pid", [
                "munged", "--force", f"--key-file={key}", f"--socket={run / 'munge.socket'}",
                f"--pid-file={run / 'munged.pid'}", f"--log-file={log / 'munged.log'}",
                f"--seed-file={run / 'munged.seed'}"])
            self._daemon(run / "slurmctld.pid", ["slurmctld"])
            for node in NODES:
                self._daemon(run / f"slurmd-{node}.pid", ["slurmd", "-N", node])
            self.wait_idle(deadline_s)
        except BaseException:
            self.stop()
            raise

    def stop(self, deadline_s: float = 20.0) -> None:
        """Cancels the jobs still there and waits (``KillWait`` and a minute) until they left,
        then stops every daemon started, by the pid its pid file holds: SIGTERM, then SIGKILL
        after ``deadline_s``."""
        if self._pid_files:
            self._cancel_jobs(self.kill_wait + 60.0)
        pids = []
        for path in reversed(self._pid_files):
            with contextlib.suppress(OSError, IndexError, ValueError):  # none, empty or partial
                pids.append(int(path.read_text().split()[0]))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + deadline_s
        while pids and time.monotonic() < end:
            pids = [pid for pid in pids if _alive(pid)]
            time.sleep(0.2)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._pid_files.clear()

    def _cancel_jobs(self, deadline_s: float) -> None:
        """``scancel`` every job of the cluster; waits until ``squeue`` lists none."""
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            jobs = self.command("squeue", "-h", "-o", "%A").split()
            if jobs:
                self.command("scancel", *jobs, check=False)
            end = time.monotonic() + deadline_s
            while jobs and time.monotonic() < end:
                time.sleep(1.0)
                jobs = self.command("squeue", "-h", "-o", "%A").split()

    def _hosts(self) -> None:
        hosts = Path("/etc/hosts")
        names = set(hosts.read_text().split())
        if not set(NODES) <= names:
            with hosts.open("a") as f:
                f.write(f"127.0.0.1 {' '.join(NODES)}\n")

    def _conf(self, ctld_port: int, slurmd_ports: list[int]) -> str:
        d, host = self.root, socket.gethostname()
        lines = [
            "ClusterName=local", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root",
            "SlurmdUser=root", "AuthType=auth/munge", f"AuthInfo=socket={d}/run/munge.socket",
            "ProctrackType=proctrack/pgid", "TaskPlugin=task/none", "SwitchType=switch/none",
            "MpiDefault=none", "ReturnToService=2", "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "JobCompType=jobcomp/none",
            "SlurmdParameters=config_overrides", f"KillWait={self.kill_wait}",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/run/slurmctld.pid", f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd-%n.log",
            f"SlurmctldPort={ctld_port}",
            # the suite's workers load 2 cores to 3-4: Slurm's 10 s RPC deadline was once too
            # short for a step launch on a slurmd ("Zero Bytes were transmitted or received")
            "MessageTimeout=60",
        ]
        for node, port in zip(NODES, slurmd_ports):
            lines.append(f"NodeName={node} NodeHostname={node} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={CPUS_PER_NODE} RealMemory=4000 State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(NODES)} Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=YES")
        return "\n".join(lines) + "\n"

    def _daemon(self, pid_file: Path, cmd: list[str], deadline_s: float = 15.0) -> None:
        """Runs a daemon that forks into the background and writes ``pid_file``."""
        self._pid_files.append(pid_file)
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                              timeout=deadline_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{cmd[0]} did not start (exit {done.returncode}): "
                               f"{done.stderr.strip()[-500:]}")
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            # OSError: no pid file yet; IndexError: the daemon created it but has not written its
            # pid yet (seen in CI under load); ValueError: a partial write
            with contextlib.suppress(OSError, IndexError, ValueError):
                if _alive(int(pid_file.read_text().split()[0])):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{cmd[0]} wrote no live pid to {pid_file} within {deadline_s:g} s")

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo`` gives it (``idle``, ``alloc``, ``comp``, ...)."""
        shown = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return dict(line.split() for line in shown.splitlines() if len(line.split()) == 2)

    def idle(self) -> bool:
        """Whether both nodes are idle: no job holds them, none is completing on them."""
        states = self.node_states()
        return all(states.get(node) == "idle" for node in NODES)

    def wait_idle(self, deadline_s: float) -> None:
        """Waits until both nodes are :meth:`idle`.

        Raises:
            RuntimeError: not within ``deadline_s`` (with what ``sinfo`` says).
        """
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.idle():
                return
            time.sleep(0.5)
        raise RuntimeError(f"the nodes were not idle within {deadline_s:g} s: sinfo says "
                           f"{self.node_states()}; logs in {self.root / 'log'}")

    def log_of(self, job_id: int) -> str:
        """The lines of the controller's and the nodes' logs that name the job, in time order
        (what a failed test shows of Slurm's side)."""
        pattern = re.compile(rf"(JobId={job_id}\b|job {job_id}\b|\[{job_id}\.)")
        lines = [line for path in sorted((self.root / "log").glob("slurm*.log"))
                 for line in path.read_text(errors="replace").splitlines()
                 if pattern.search(line)]
        return "\n".join(sorted(lines))

    # ------------------------------------------------------------------------ jobs
    def command(self, *args: str, check: bool = True, timeout: float = 30.0) -> str:
        """Runs a Slurm command against this cluster; returns its stdout.

        Raises:
            RuntimeError: ``check`` and a non-zero exit (with its stderr).
        """
        done = subprocess.run(args, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, script: Path, options: Iterable[str] = (),
               env: Mapping[str, str] | None = None, cwd: Path | None = None) -> int:
        """Submits ``script`` (its ``#SBATCH`` lines, overridden by ``options``); the job's
        environment is this process's plus ``env``. Returns the job id."""
        done = subprocess.run(["sbatch", "--parsable", *options, str(script)],
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=30, check=False, cwd=cwd)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {script.name}: exit {done.returncode}: "
                               f"{done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields of the job (of its first component for a hetjob)."""
        text = self.command("scontrol", "-o", "show", "job", str(job_id))
        first = text.splitlines()[0] if text.strip() else ""
        return dict(re.findall(r"(\w+)=(\S*)", first))

    def state(self, job_id: int) -> str:
        """The job's state (``RUNNING``, ``COMPLETED``, ...)."""
        return self.job(job_id).get("JobState", "")

    def wait(self, job_id: int, states: Iterable[str] = TERMINAL_STATES,
             deadline_s: float = 120.0, release: bool = False) -> dict[str, str]:
        """Waits until the job is in one of ``states``; returns its fields. ``release``: a
        requeued job held back (``Reason=BeginTime``, about two minutes) starts at once, once its
        last session has left the nodes (a release before races with that session's end; the
        tests that release run one job at a time).

        Raises:
            TimeoutError: not within ``deadline_s`` (with the job's last fields).
        """
        wanted, end, fields = set(states), time.monotonic() + deadline_s, {}
        while time.monotonic() < end:
            fields = self.job(job_id)
            if fields.get("JobState") in wanted:
                return fields
            if release and fields.get("JobState") == "PENDING" and \
                    fields.get("Reason") == "BeginTime" and self.idle():
                self.command("scontrol", "update", f"JobId={job_id}", "StartTime=now")
            time.sleep(1.0)
        raise TimeoutError(f"job {job_id} not in {sorted(wanted)} within {deadline_s:g} s: "
                           f"{fields.get('JobState')} ({fields.get('Reason')})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie is gone for our purposes
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True
