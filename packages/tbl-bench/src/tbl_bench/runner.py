"""Runs each round of each configuration in its own subprocess (`tbl_bench.child`, started by ``python -c``).

In-process comparisons contaminate each other (thread pools, allocator state,
imported libraries), so every round of every `Config` gets a fresh
interpreter: this one, or the peer interpreter for a peer tool's
configuration. A crash, a timeout or a non-zero exit becomes a "failed" round
with the tail of the child's stderr; the run goes on.

A peer interpreter (another virtual environment, holding TurboLoader or
litdata) sees tbl_bench itself through a directory holding only a link to this
package, so nothing else of this environment leaks into it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tbl_bench.config import Config
from tbl_bench.fingerprint import load_average
from tbl_bench.results import config_result

__all__ = ["call_in", "run_config", "run_round"]

_STDERR_TAIL = 2000
_PACKAGE_DIR = Path(__file__).resolve().parent


def _same_interpreter(python: str) -> bool:
    """Whether `python` is this interpreter *and environment*. Paths are compared without following
    links: every virtual environment's python links to the same base binary, and which packages it
    sees depends on the path it was started by (its pyvenv.cfg)."""
    return os.path.normpath(os.path.abspath(python)) == os.path.normpath(os.path.abspath(sys.executable))


# The child starts as `python -c`, not `python -m tbl_bench.child`: process pools started under spawn or
# forkserver re-run the parent's __main__ module in every worker before its first task, and under -m that
# is this harness (~0.1 s of imports per worker, each time a measured tool starts its pool). That cost
# belongs to the bench, not to the tool; a `-c` main is not re-run.
_CHILD_BOOT = "import sys; from tbl_bench.child import main; sys.exit(main(sys.argv[1:]))"


def _child(python: str, args: list[str], tmp: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run `tbl_bench.child` with ARGS in `python` with `env`; raises subprocess.TimeoutExpired."""
    env = dict(env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if not _same_interpreter(python):
        if not Path(python).exists():
            raise FileNotFoundError(f"peer interpreter {python} does not exist")
        (tmp / "path").mkdir()
        (tmp / "path" / "tbl_bench").symlink_to(_PACKAGE_DIR, target_is_directory=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp / "path"), env.get("PYTHONPATH")) if p)
    return subprocess.run([python, "-c", _CHILD_BOOT, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _tail(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr or proc.stdout or "")[-_STDERR_TAIL:].strip()


def run_round(config: Config, *, peer_python: str | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One round of `config` in a child interpreter: the round record ("ok", "skipped" or "failed")."""
    if config.skip is not None:
        return {"status": "skipped", "reason": config.skip}
    python = (peer_python or sys.executable) if config.peer else sys.executable
    child_env = {**(os.environ if env is None else env), **config.env}
    # The machine's load around each round: a figure measured while someone else ran says so.
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="tbl-bench-") as tmp:
        cfg_path, out_path = Path(tmp) / "config.json", Path(tmp) / "round.json"
        cfg_path.write_text(json.dumps(config.to_dict()))
        try:
            proc = _child(python, ["measure", str(cfg_path), str(out_path)], Path(tmp), child_env, config.timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "reason": f"timed out after {config.timeout_s:.0f} s"}
        except FileNotFoundError as e:
            return {"status": "failed", "reason": str(e)}
        if proc.returncode != 0 or not out_path.exists():
            return {"status": "failed", "reason": f"child exited with status {proc.returncode}: {_tail(proc)}"}
        record = json.loads(out_path.read_text())
    record["python"] = python
    record["loadavg_before"] = load_before
    record["loadavg_after"] = load_average()
    return record


def run_config(config: Config, *, rounds: int = 1, peer_python: str | None = None,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """All rounds of one configuration, one after another; the aggregated result.

    A whole run interleaves configurations round-robin instead (`tbl_bench.bench`).
    """
    records = []
    for _ in range(rounds):
        records.append(run_round(config, peer_python=peer_python, env=env))
        if records[-1]["status"] == "skipped":
            break
    return config_result(config, records)


def call_in(python: str, target: str, kwargs: dict[str, Any], *, timeout_s: float = 7200.0) -> Any:
    """`target(**kwargs)` ("module:function") in a child `python`; returns its JSON result.

    For preparing a peer tool's data with the peer's own interpreter. Raises
    RuntimeError with the child's stderr tail when it fails.
    """
    with tempfile.TemporaryDirectory(prefix="tbl-bench-call-") as tmp:
        kw_path, out_path = Path(tmp) / "kwargs.json", Path(tmp) / "out.json"
        kw_path.write_text(json.dumps(kwargs))
        try:
            proc = _child(python, ["call", target, str(kw_path), str(out_path)], Path(tmp), dict(os.environ), timeout_s)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{target} timed out after {timeout_s:.0f} s") from e
        except FileNotFoundError as e:
            raise RuntimeError(str(e)) from e
        if proc.returncode != 0 or not out_path.exists():
            raise RuntimeError(f"{target} under {python} exited with status {proc.returncode}: {_tail(proc)}")
        return json.loads(out_path.read_text())
