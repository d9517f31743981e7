"""A one-node SLURM cluster (slurmctld, slurmd and munged from Debian's packages, with accounting:
slurmdbd on a MariaDB server) and a PostgreSQL server (initdb and pg_ctl), each started in a folder
of its own on loopback, for the tests of
benchmark/slurm.py (tests/test_cluster.py). Where the packages are missing, or the tests do not run
as root (slurmd must), the tests skip with one line that says how to install them; where
CLUSTER_TESTS=required (.ci/run sets it), they fail instead."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import closing
from pathlib import Path

import pytest

SLURM_PROGRAMS = (
    "slurmctld",
    "slurmd",
    "munged",
    "sbatch",
    "squeue",
    "scontrol",
    "scancel",
    "sacct",
)
SLURM_PROGRAMS += ("slurmdbd", "mariadbd", "mariadb-install-db")
POSTGRES_PROGRAMS = ("initdb", "pg_ctl")
PACKAGES = "slurm-wlm slurmdbd munge mariadb-server postgresql"
INSTALL = f"as root: apt-get install {PACKAGES} (Debian's packages; .ci/run installs them), then run the tests as root"
POSTGRES_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
"""where Debian keeps initdb and pg_ctl (off the PATH)"""
START_SECONDS = 60.0


PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", *map(str, POSTGRES_BIN)])
"""the PATH with the folders where Debian puts the daemons"""


def missing(programs: tuple[str, ...]) -> list[str]:
    return [program for program in programs if shutil.which(program, path=PATH) is None]


def skip_or_fail(programs: tuple[str, ...]) -> None:
    """Skip (fail where CLUSTER_TESTS=required) unless `programs` are installed and this is root."""
    absent = missing(programs)
    why = f"missing {', '.join(absent)}" if absent else "not root" if os.geteuid() != 0 else None
    if why is None:
        return
    message = f"the cluster tests need SLURM and PostgreSQL ({why}): {INSTALL}"
    if os.environ.get("CLUSTER_TESTS") == "required":
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def log_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def wait_until(ready, what: str, seconds: float = START_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start in {seconds:.0f} s")
        time.sleep(0.2)


class Slurm:
    """A one-node cluster whose client commands find it through SLURM_CONF (`environment`)."""

    def __init__(self, folder: Path, cpus: int = 4):
        """Start it: its jobs go to partition `debug`, whose jobs a job of partition `urgent`
        preempts (requeued)."""
        self.folder = folder
        node = socket.gethostname().split(".")[0]
        ports = free_port(), free_port(), free_port(), free_port()
        for name in ("state", "spool"):
            (folder / name).mkdir(parents=True, exist_ok=True)
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = folder / "munge.socket"
        self.conf = folder / "slurm.conf"
        # accounting (sacct): slurmdbd, on a MariaDB server of its own
        (folder / "slurmdbd.conf").write_text(
            f"""AuthType=auth/munge
AuthInfo=socket={socket_path}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports[2]}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports[3]}
StorageUser=root
StorageLoc=slurm_acct_db
PidFile={folder / "slurmdbd.pid"}
LogFile={folder / "slurmdbd.log"}
"""
        )
        (folder / "slurmdbd.conf").chmod(0o600)
        # cred_expire is also how long a requeued job waits before it starts again (120 s by default)
        self.conf.write_text(
            f"""ClusterName=onefile-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path},cred_expire=5
StateSaveLocation={folder / "state"}
SlurmdSpoolDir={folder / "spool"}
SlurmctldPidFile={folder / "slurmctld.pid"}
SlurmdPidFile={folder / "slurmd.pid"}
SlurmctldLogFile={folder / "slurmctld.log"}
SlurmdLogFile={folder / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports[2]}
AccountingStoragePass={socket_path}
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
KillWait=30
MinJobAge=2
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2
"""
        )
        self.environment = {**os.environ, "PATH": PATH, "SLURM_CONF": str(self.conf)}
        subprocess.run(
            ["munged", "--force", f"--socket={socket_path}", f"--key-file={key}",
             f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
             f"--seed-file={folder / 'munged.seed'}"],
            env=self.environment,
            check=True,
        )  # fmt: skip
        database = folder / "mariadb"
        subprocess.run(["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={database}",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       env=self.environment, check=True, capture_output=True)  # fmt: skip
        self.mariadb = subprocess.Popen(
            ["mariadbd", "--no-defaults", "--user=root", f"--datadir={database}", f"--port={ports[3]}",
             "--bind-address=127.0.0.1", f"--socket={folder / 'mariadb.socket'}", "--skip-grant-tables",
             f"--log-error={folder / 'mariadb.log'}"],
            env=self.environment,
        )  # fmt: skip
        wait_until(lambda: (folder / "mariadb.socket").exists(), f"MariaDB (log in {folder})")
        subprocess.run(["slurmdbd"], env=self.environment, check=True)
        wait_until(
            lambda: "started" in log_text(folder / "slurmdbd.log"), f"slurmdbd (log in {folder})"
        )
        subprocess.run(["slurmctld", "-i"], env=self.environment, check=True)
        subprocess.run(["slurmd"], env=self.environment, check=True)
        wait_until(self.node_idle, f"the SLURM node (logs in {folder})")

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            command, env=self.environment, capture_output=True, text=True, check=check
        )

    def node_idle(self) -> bool:
        answer = self.run("sinfo", "-h", "-o", "%t", check=False)
        return answer.returncode == 0 and answer.stdout.strip() in ("idle", "mix", "alloc")

    def jobs(self) -> list[str]:
        """Every element squeue lists (ARRAY_INDEX), whatever its state."""
        return self.run("squeue", "-h", "-r", "-t", "all", "-o", "%i").stdout.split()

    def stop(self) -> None:
        """Cancel every job, wait for it to end, then stop the daemons, and kill whatever of this
        cluster is left (an orphaned slurmstepd: every process of it has its SLURM_CONF)."""
        self.run("scancel", "-u", "root", check=False)
        deadline = time.monotonic() + 30
        while self.run("squeue", "-h", check=False).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.run("scontrol", "shutdown", check=False)
        for pid_file in ("slurmdbd.pid", "munged.pid"):
            path = self.folder / pid_file
            try:
                os.kill(int(path.read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        self.mariadb.terminate()
        self.mariadb.wait(timeout=30)
        time.sleep(2)
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def processes(self) -> list[int]:
        """The processes started with this cluster's SLURM_CONF."""
        mine = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and mine in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                pass
        return [pid for pid in found if pid != os.getpid()]


class Postgres:
    """A PostgreSQL server on a loopback port, as Debian's `postgres` user (initdb refuses root), in
    a temporary folder of its own (pytest's are root's alone)."""

    def __init__(self):
        self.folder = folder = Path(tempfile.mkdtemp(prefix="onefile-rl-postgres-"))
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        self.port = free_port()
        self.data = folder / "data"
        self.environment = {**os.environ, "PATH": PATH}
        self._as_postgres("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")
        options = f"-p {self.port} -h 127.0.0.1 -k {folder}"
        self._as_postgres(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(folder / "log"), "-w", "start"
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *command: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *command], env=self.environment, check=True,
                       capture_output=True, cwd=self.folder)  # fmt: skip

    def stop(self) -> None:
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
