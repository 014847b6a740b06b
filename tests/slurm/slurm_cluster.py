"""A real one-node Slurm cluster in a temporary directory, for tests that submit jobs.

    with SlurmCluster(workdir) as cluster:
        subprocess.run(["sbatch", "--parsable", "--wrap=hostname"], env=cluster.env, check=True)

On entry it writes a munge key and starts its own `munged` (socket, key, pid, seed and log files in
workdir, so it neither needs nor disturbs a system munged), writes slurm.conf naming this host as
controller and as the single node of one partition, `debug` (ports picked free at run time, state,
spool, pid and log files in workdir, no accounting), starts `slurmctld` and `slurmd` in the
foreground as children of this process and waits until `sinfo` reports the node idle. On exit,
also when the body raised, it cancels every job, stops slurmd, slurmctld and munged (SIGTERM, then
SIGKILL) and kills whatever process of this cluster is left (a process is this cluster's when its
environment or command line names this cluster's slurm.conf or munge socket).

Pass `cluster.env` (os.environ plus SLURM_CONF, less the SLURM_*, SBATCH_*, SRUN_*, PMI_*, PMIX_*
variables of an enclosing job) to every sbatch, squeue, srun, scancel, sinfo, scontrol. Needs root
(the daemons run as SlurmUser=root) and Debian's slurm-wlm and munge; call skip_reason() first.
Open MPI programs launched with srun need `--mpi=pmix` (MPI_SRUN_OPTION). Finished jobs stay
visible to squeue -t all and scontrol for MinJobAge (300 s); sacct does not work (no slurmdbd).
The extra_conf lines are appended to slurm.conf (a key given twice: the last value is used).

Pure standard library, Python 3.11.
"""
from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
SLURM_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCONTROL_",
                      "PMIX_", "PMI_")

# The srun option with which Open MPI 4.1 (Debian 12: built against PMIx only, no PMI-1/PMI-2)
# forms its world under this Slurm (22.05, plugin mpi/pmix_v4, which loads libpmix.so from
# libpmix-dev). --mpi=pmi2 and --mpi=none fail in MPI_Init ("OMPI was not built with SLURM's PMI
# support"). As root no OMPI_ALLOW_RUN_AS_ROOT* is needed: only mpirun checks for root.
MPI_SRUN_OPTION = "--mpi=pmix"


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def missing_reason() -> str | None:
    """None when Slurm's and munge's programs are installed, else one line naming the missing ones
    (a failure: scripts/setup-tests.sh installs them)."""
    missing = [n for n in DAEMONS + CLIENTS if _which(n) is None]
    if missing:
        return (f"Slurm/munge programs not found: {', '.join(missing)} (Debian packages slurm-wlm, munge: "
                "scripts/setup-tests.sh installs them)")
    return None


def skip_reason() -> str | None:
    """None when this machine can run a cluster, else one line saying why not (not root: a skip)."""
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root; not running as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In a daemon's process: SIGTERM when the process that started the cluster ends, however."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _tail(path: pathlib.Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"    ({path.name}: not written)"
    return "\n".join("    " + l for l in text[-lines:]) or f"    ({path.name}: empty)"


def _node_hardware() -> tuple[str, int]:
    """This host's node name and CPU count as `slurmd -C` reports them."""
    name, cpus = socket.gethostname().split(".")[0], os.cpu_count() or 1
    try:
        out = subprocess.run([_which("slurmd") or "slurmd", "-C"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return name, cpus
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return fields.get("NodeName", name), int(fields.get("CPUs", cpus))


class SlurmCluster:
    """Context manager: a running one-node Slurm cluster whose files all lie in `workdir`."""

    partition = "debug"

    def __init__(self, workdir: pathlib.Path, cpus: int = 2, extra_conf: str = ""):
        self.workdir = pathlib.Path(workdir).resolve()
        self.cpus = cpus
        self.extra_conf = extra_conf
        self.conf = self.workdir / "slurm.conf"
        self.munge_socket = self.workdir / "munge" / "munge.socket"
        self.env: dict[str, str] = {}
        self.node = ""
        self.hw_cpus = 0
        self.startup_s = 0.0
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, pathlib.Path] = {}

    # ---------------------------------------------------------------- start
    def __enter__(self) -> "SlurmCluster":
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _start(self) -> None:
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        # Unix socket paths are limited to 107 bytes (the longest here is the slurmd step socket).
        if len(str(self.workdir)) > 60:
            raise RuntimeError(f"workdir path too long for Slurm's and munge's sockets: {self.workdir}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start_munged()
        self._write_conf()
        # Slurm variables of an enclosing job (the tests may run inside one) would point srun and
        # sbatch at that job, so they are left out.
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(SLURM_ENV_PREFIXES) or k.startswith("PMIX_MCA_")}
        self.env["SLURM_CONF"] = str(self.conf)
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-c", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf)])
        self._wait_idle()

    def _spawn(self, name: str, argv: list, env: dict | None = None) -> None:
        log = self.workdir / f"{name}.out"
        self._logs[name] = log
        with open(log, "wb") as out:
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env if env is not None else self.env, cwd=self.workdir,
                start_new_session=True, preexec_fn=_die_with_parent)

    def _start_munged(self) -> None:
        d = self.munge_socket.parent
        d.mkdir(exist_ok=True)
        d.chmod(0o755)  # munged wants the socket's directory searchable by all
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._spawn("munged", [
            _which("munged"), "--foreground", "--force",
            f"--socket={self.munge_socket}", f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}"], env=dict(os.environ))
        deadline = time.monotonic() + 15
        while not self.munge_socket.exists():
            if self._procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("munged did not start\n" + self._log_tails())
            time.sleep(0.05)

    def _write_conf(self) -> None:
        w = self.workdir
        for sub in ("state", "spool", "log", "tmp"):
            (w / sub).mkdir(exist_ok=True)
        self.node, self.hw_cpus = _node_hardware()
        ctld_port, slurmd_port = _free_port(), _free_port()
        while slurmd_port == ctld_port:
            slurmd_port = _free_port()
        (w / "plugstack.conf").write_text("")
        # Every CPU is declared a core of one socket (no hyperthreads), so under CR_Core one-CPU
        # tasks run side by side; config_overrides keeps the node up when the declared CPUs
        # differ from the hardware's (no binding is done: TaskPlugin=task/none).
        self.conf.write_text(f"""\
# Written by tests/slurm/slurm_cluster.py; slurmd -C reports {self.hw_cpus} CPUs on {self.node}.
ClusterName=ablatetest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={w / 'state'}
SlurmdSpoolDir={w / 'spool'}
TmpFS={w / 'tmp'}
SlurmctldPidFile={w / 'slurmctld.pid'}
SlurmdPidFile={w / 'slurmd.pid'}
SlurmctldLogFile={w / 'log' / 'slurmctld.log'}
SlurmdLogFile={w / 'log' / 'slurmd.log'}
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={w / 'plugstack.conf'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
ReturnToService=2
MinJobAge=300
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""" + (self.extra_conf.strip() + "\n" if self.extra_conf.strip() else ""))
        self._logs["slurmctld.log"] = w / "log" / "slurmctld.log"
        self._logs["slurmd.log"] = w / "log" / "slurmd.log"

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        state = ""
        while True:
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while the cluster started\n"
                                       + self._log_tails())
            r = self.run("sinfo", "-h", "-o", "%T", check=False, timeout=30)
            state = (r.stdout.strip() or r.stderr.strip()).replace("\n", " ")
            if r.returncode == 0 and state == "idle":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm node did not become idle in {START_TIMEOUT_S:.0f} s "
                                   f"(sinfo: {state!r})\n" + self._log_tails())
            time.sleep(0.2)

    def _log_tails(self) -> str:
        return "\n".join(f"  {p}:\n{_tail(p)}" for p in self._logs.values())

    # ---------------------------------------------------------------- helpers
    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster; its stdout and stderr as text."""
        argv = [_which(argv[0]) or argv[0], *argv[1:]]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout)

    def jobs_left(self, job_id: str | None = None) -> list[str]:
        """The ids of the jobs (array tasks one by one) pending, running or completing; those of
        job job_id only when given."""
        r = self.run("squeue", "-h", "-r", "-o", "%i", *(["-j", job_id] if job_id else []),
                     check=False)
        return r.stdout.split() if r.returncode == 0 else []

    def wait_jobs(self, job_id: str | None = None, timeout: float = 60) -> None:
        """Waits until jobs_left(job_id) is empty; TimeoutError (with squeue's view) if it is not
        within timeout seconds."""
        deadline = time.monotonic() + timeout
        while left := self.jobs_left(job_id):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm jobs still queued after {timeout:.0f} s: {' '.join(left)}\n"
                                   + self.run("squeue", "-r", check=False).stdout)
            time.sleep(0.2)

    def array_states(self, job_id: str) -> dict[int, tuple[str, str]]:
        """Array task id -> (state, reason) of every task of array job job_id, finished ones too
        (slurmctld keeps finished jobs for MinJobAge = 300 s; there is no accounting database,
        so sacct does not work): e.g. {0: ("COMPLETED", "None"), 1: ("FAILED", "NonZeroExitCode")}.
        Pending tasks not yet split off the array are left out."""
        r = self.run("squeue", "-h", "-r", "-t", "all", "-j", job_id, "-o", "%K %T %r")
        states = {}
        for line in r.stdout.splitlines():
            task, state, reason = (line.split(None, 2) + ["", ""])[:3]
            if task.isdigit():
                states[int(task)] = (state, reason)
        return states

    def pids(self) -> dict[str, int]:
        """The daemons' process ids."""
        return {name: p.pid for name, p in self._procs.items()}

    # ---------------------------------------------------------------- stop
    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.env and self._procs.get("slurmctld") and self._procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", f"--partition={self.partition}", check=False, timeout=20)
                deadline = time.monotonic() + 15
                while self.jobs_left() and time.monotonic() < deadline:
                    time.sleep(0.2)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            p = self._procs.get(name)
            if p is None:
                continue
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self._kill_leftovers()
        self._procs.clear()

    def _mine(self, pid: int) -> bool:
        """Whether process pid belongs to this cluster (names its slurm.conf or munge socket)."""
        marks = (f"SLURM_CONF={self.conf}".encode(), str(self.conf).encode(),
                 str(self.munge_socket).encode())
        try:
            env = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return marks[0] in env or any(m in a for a in cmd for m in marks[1:])

    def _kill_leftovers(self) -> None:
        """SIGKILL every process of this cluster still alive (slurmstepd, job processes)."""
        me = os.getpid()
        for _ in range(3):
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me]
            # The test process and its ancestors carry SLURM_CONF only if the caller exported it.
            ancestors = set()
            pid = me
            while pid > 1:
                ancestors.add(pid)
                try:
                    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
                    pid = int(stat.rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    break
            left = [p for p in pids if p not in ancestors and self._mine(p)]
            if not left:
                return
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.3)
