"""The scripts' pytest entries run each script as its user does: ``python -m tests.<kind>.<script>`` from the
repository root, in a fresh process, and read its summary line."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ScriptRun:
    command: str
    code: int
    out: str
    err: str

    def summary(self, prefix: str) -> str:
        """The script's last line starting with ``prefix`` (its summary); fails the test when there is none."""
        lines = [line for line in self.out.splitlines() if line.startswith(prefix)]
        assert lines, f"{self.command}: no {prefix!r} summary line (exit {self.code})\n{self.tail()}"
        return lines[-1]

    def tail(self, lines: int = 20) -> str:
        return "\n".join((self.out + self.err).strip().splitlines()[-lines:])


def run_script(module: str, *args: str, timeout: float, env: dict | None = None) -> ScriptRun:
    """Run ``python -m module args`` from the repository root; a run past ``timeout`` fails the test."""
    environment = dict(os.environ if env is None else env)
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = f"python -m {module} {' '.join(args)}".rstrip()
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=environment, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{command}: no summary within {timeout:.0f} s\n{out[-3000:]}")
    return ScriptRun(command, done.returncode, done.stdout, done.stderr)
