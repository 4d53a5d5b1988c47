"""tbl convert under signals: Ctrl-C at start-up and mid-run, SIGTERM and SIGKILL of the parent, a killed worker.

A slow source (large JPEGs decoded at full scale) keeps a 2-worker conversion busy for several
seconds. Every outcome is checked: the exit code, one line and no traceback on stderr, nothing
published, no temp files, and no process of the conversion (workers, forkserver, resource tracker)
left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from convert_images import (
    alive,
    cli_argv,
    descendants,
    error_lines,
    kill_all,
    wait_for_descendants,
    wait_gone,
)
from PIL import Image

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture(scope="module")
def slow_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow") / "src"
    rng = np.random.default_rng(0)
    one = root.parent / "one.jpg"
    Image.fromarray(rng.integers(0, 256, (300, 300, 3), dtype=np.uint8)).resize((2400, 2400)).save(one, quality=85)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(120):  # copies, not links: each is its own file
            shutil.copyfile(one, root / f"c{c}" / f"{i:03d}.jpg")
    return root


def start(src: Path, dst: Path) -> subprocess.Popen:
    argv = cli_argv(str(src), str(dst), "--size", "64", "--no-draft", "--workers", "2", "--quiet")
    # its own session: a signal to its process group is what a terminal's Ctrl-C does. SIGINT's default
    # action is restored in it, as in a terminal: a test run started in the background of a shell without job
    # control inherits SIGINT ignored, and the conversion would rightly keep ignoring it.
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen, timeout: float = 60) -> str:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert "Traceback" not in err, err
    return err


def assert_nothing_left(dst: Path, pids: set[int]) -> None:
    left = wait_gone(pids, timeout=10)
    kill_all(left)
    assert not left, f"processes of the conversion still running: {sorted(left)}"
    assert not dst.exists()
    assert [p.name for p in dst.parent.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("when", ["start-up", "mid-run"])
def test_ctrl_c(tmp_path: Path, slow_source: Path, when: str) -> None:
    dst = tmp_path / "out.tbl"
    proc = start(slow_source, dst)
    # start-up: as soon as the first helper process exists (the pool is starting); mid-run: workers busy
    pids = wait_for_descendants(proc, 1 if when == "start-up" else 4)
    if when == "mid-run":
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    err = finish(proc)
    pids |= descendants(proc.pid)
    assert proc.returncode == 130, err
    assert error_lines(err) == [f"tbl convert: interrupted; nothing was published at {dst}"], err
    assert_nothing_left(dst, pids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_parent_leaves_no_process(tmp_path: Path, slow_source: Path, sig: signal.Signals) -> None:
    dst = tmp_path / "out.tbl"
    proc = start(slow_source, dst)
    pids = wait_for_descendants(proc, 4)  # resource tracker, forkserver, 2 workers
    time.sleep(0.5)
    pids |= descendants(proc.pid)
    proc.send_signal(sig)  # the parent only, as `kill PID` does
    err = finish(proc)
    if sig == signal.SIGTERM:
        assert proc.returncode == 143 and "terminated" in err, err
        assert_nothing_left(dst, pids)
    else:
        assert proc.returncode == -signal.SIGKILL
        left = wait_gone(pids, timeout=10)
        kill_all(left)
        assert not left, f"processes of the conversion still running: {sorted(left)}"
        assert not dst.exists()  # a killed writer leaves only its hidden temp files


def test_killed_worker_is_a_worker_crash(tmp_path: Path, slow_source: Path) -> None:
    dst = tmp_path / "out.tbl"
    proc = start(slow_source, dst)
    pids = wait_for_descendants(proc, 4)
    time.sleep(0.5)
    pids |= descendants(proc.pid)
    children = {p for p in pids if Path(f"/proc/{p}/stat").exists()}
    parent_of = {p: int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) for p in alive(children)}
    workers = [p for p, pp in parent_of.items() if pp != proc.pid]  # forked by the forkserver
    assert workers, parent_of
    os.kill(workers[0], signal.SIGKILL)
    err = finish(proc)
    assert proc.returncode == 3 and "worker process died" in err, err
    assert len(error_lines(err)) == 1
    assert_nothing_left(dst, pids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ray_engine_keeps_the_local_engines_signal_contract(tmp_path: Path, slow_source: Path,
                                                            sig: signal.Signals) -> None:
    """`--engine ray` mid-run: Ctrl-C (the process group) exits 130 and SIGTERM (the driver only) 143, each with
    its one line, nothing published, no staging folder, and the Ray instance it started shut down."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'tbl-loader[ray]'")
    dst = tmp_path / "out.tbl"
    argv = cli_argv(str(slow_source), str(dst), "--size", "64", "--no-draft", "--engine", "ray", "--quiet")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    deadline = time.monotonic() + 120
    while not any(".tbl-tmp-ray-" in p.name for p in tmp_path.iterdir()):  # the write tasks have started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    time.sleep(1.0)
    pids = descendants(proc.pid)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    err = finish(proc, timeout=120)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert error_lines(err) == [f"tbl convert: interrupted; nothing was published at {dst}"], err
    else:
        assert proc.returncode == 143, err
        assert error_lines(err) == [f"tbl convert: terminated (SIGTERM); nothing was published at {dst}"], err
    left = wait_gone(pids, timeout=30)  # Ray's own processes (GCS, raylet, workers) stop with its shutdown
    kill_all(left)
    assert not left, f"processes of the Ray instance still running: {sorted(left)}"
    assert not dst.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert json.loads((tmp_path / "out.tbl.report.json").read_text())["status"] == "failed"  # as the local engine's
