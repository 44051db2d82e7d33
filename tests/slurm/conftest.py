"""The ``slurm`` tier: one Slurm cluster of two nodes on this host for the whole session, and the
docs' batch scripts as the Markdown holds them.

The tier skips, with the reason, where Slurm or munge is not installed or the tests do not run
as root (the daemons run as root). ``.ci/run`` installs both with apt, so CI runs the tier.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.slurm_cluster import LocalSlurm, missing_slurm

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
_FENCE = re.compile(r"```bash\n(.*?)```", re.S)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of this folder is ``slurm`` and ``slow``; without Slurm they are skipped."""
    reason = missing_slurm()
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slurm)
            item.add_marker(pytest.mark.slow)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """The cluster: started once (until ``sinfo`` shows both nodes idle), stopped by pid."""
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def doc_script(page: str, job_name: str) -> str:
    """The batch script of ``docs/<page>`` whose ``#SBATCH --job-name`` is ``job_name``, as
    written (one fenced bash block)."""
    found = [body for body in _FENCE.findall((DOCS / page).read_text())
             if re.search(rf"^#SBATCH --job-name={re.escape(job_name)}\s*$", body, re.M)]
    assert len(found) == 1, f"docs/{page} has {len(found)} scripts named {job_name}"
    return found[0]


def free_port() -> int:
    """A TCP port free now, outside Ray's worker ports (10002-19999)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not 10002 <= port <= 19999:
            return port
    raise RuntimeError("no free port")


@dataclass
class DocJob:
    """One docs script submitted to the cluster: its folder, output and run folders."""

    slurm: LocalSlurm
    page: str
    name: str
    folder: Path
    env: dict[str, str] = field(default_factory=dict)
    job_id: int = 0

    @property
    def runs(self) -> Path:
        """``$RUNS/job-ID``: the job's runs folder."""
        return Path(self.env["RUNS"]) / f"job-{self.job_id}"

    @property
    def output(self) -> str:
        """The job's stdout and stderr so far (every session)."""
        path = self.folder / f"slurm-{self.job_id}.out"
        return path.read_text(errors="replace") if path.is_file() else "<no output yet>"

    def submit(self, *options: str) -> int:
        """Writes the script from the docs and submits it with ``options`` (which override its
        ``#SBATCH`` lines)."""
        script = self.folder / f"{self.name}.sh"
        script.write_text(doc_script(self.page, self.name))
        self.job_id = self.slurm.sbatch(
            script, ["--output", str(self.folder / "slurm-%j.out"), "--chdir", str(self.folder),
                     *options], env=self.env, cwd=self.folder)
        return self.job_id

    def wait(self, deadline_s: float, **kw: object) -> dict[str, str]:
        """The job's final fields; on a timeout, the error shows its output."""
        try:
            return self.slurm.wait(self.job_id, deadline_s=deadline_s, **kw)  # type: ignore[arg-type]
        except TimeoutError as err:
            raise AssertionError(f"{err}\n--- job output ---\n{self.output[-4000:]}") from None

    def completed(self, fields: dict[str, str]) -> None:
        """Asserts that the job ended COMPLETED, exit 0 (with its output otherwise)."""
        assert (fields.get("JobState"), fields.get("ExitCode")) == ("COMPLETED", "0:0"), (
            f"job {self.job_id}: {fields.get('JobState')} {fields.get('ExitCode')} "
            f"({fields.get('Reason')})\n--- job output ---\n{self.output[-6000:]}\n"
            f"--- Slurm's logs on the job ---\n{self.slurm.log_of(self.job_id)[-4000:]}")

    def run_dirs(self) -> list[Path]:
        """The run folders of the job, oldest name first."""
        return sorted(p for p in self.runs.iterdir() if p.is_dir()) if self.runs.is_dir() else []

    def summary(self) -> dict:
        """``summary.json`` of the job's one finished run."""
        done = [p for p in self.run_dirs() if (p / "summary.json").is_file()]
        assert len(done) == 1, f"{self.runs}: {len(done)} finished runs\n{self.output[-4000:]}"
        return json.loads((done[0] / "summary.json").read_text())


@pytest.fixture
def doc_job(slurm: LocalSlurm, tmp_path: Path):
    """Makes a :class:`DocJob` for ``(page, job name)``, with the environment the scripts read:
    this venv, a private home (Ray's token) and Ray folder, free ports, a runs folder."""
    home = tmp_path / "home"
    home.mkdir()
    # Ray's sockets live under RAY_TMPDIR, whose path must stay short (AF_UNIX: 107 bytes)
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))

    def make(page: str, name: str, **env: str) -> DocJob:
        base = {
            "VENV": str(Path(sys.executable).parent.parent), "HOME": str(home),
            "RAY_TMPDIR": str(ray_tmp), "RAY_PORT": str(free_port()),
            "RDZV_PORT": str(free_port()), "RUNS": str(tmp_path / "runs"),
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
        }
        return DocJob(slurm, page, name, tmp_path, {**base, **env})

    yield make
    shutil.rmtree(ray_tmp, ignore_errors=True)
