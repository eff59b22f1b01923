"""The command line: ``--version``, and ``nvblaslt info`` into a reader that leaves early (``| head``)."""

from __future__ import annotations

import os
import subprocess
import sys

import nvblaslt


def test_version_is_the_package_version():
    done = subprocess.run([sys.executable, "-m", "nvblaslt", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"nvblaslt {nvblaslt.__version__}"


def test_info_into_a_closed_pipe_stops_quietly():
    reader, writer = os.pipe()
    os.close(reader)  # the reader has left before the first line: every write is a broken pipe
    try:
        done = subprocess.run([sys.executable, "-m", "nvblaslt", "info"], stdout=writer, stderr=subprocess.PIPE,
                              timeout=60)
    finally:
        os.close(writer)
    assert b"BrokenPipeError" not in done.stderr and b"Traceback" not in done.stderr, done.stderr.decode()
    assert done.returncode in (0, 1)  # 1: no libcublasLt on this machine, said on stdout
