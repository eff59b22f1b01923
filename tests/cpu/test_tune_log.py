"""``nvblaslt tune --log FILE`` without a GPU (``tune`` itself stood in): the search's log written where asked,
each problem's line in it, the package's logger left as it was, warnings still on stderr, and a path it
cannot write refused before any tuning."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from nvblaslt import _tune
from nvblaslt._errors import NvblasltValueError


def test_tune_log_writes_the_search_log_and_leaves_the_logger_as_it_was(tmp_path, monkeypatch, capsys):
    package_logger = logging.getLogger("nvblaslt")
    before = (list(package_logger.handlers), package_logger.level)

    def tune(*args, progress, **kwargs):  # what a search logs, by both ways the package logs, then its line
        logging.getLogger("nvblaslt").info("search: kept %s", "id 66 tile 128x64")
        from nvblaslt._logging import logger
        logger.info("confirmation: %s at %.4f× the first pick", "id 66", 0.9731)
        progress("[1/1] a problem: default (0.5 s, 4 s left)")
    monkeypatch.setattr(_tune, "tune", tune)
    log = tmp_path / "tune.log"
    assert _tune.main(["--problems", str(tmp_path / "p.jsonl"), "--budget", "5", "--log", str(log)]) == 0
    lines = log.read_text().splitlines()
    assert [line.split(None, 1)[1] for line in lines] == ["search: kept id 66 tile 128x64",
                                                          "confirmation: id 66 at 0.9731× the first pick",
                                                          "[1/1] a problem: default (0.5 s, 4 s left)"]
    assert all(line.split()[0].isdigit() for line in lines)  # milliseconds
    assert "[1/1] a problem: default" in capsys.readouterr().err  # the progress line is printed as ever
    assert (list(package_logger.handlers), package_logger.level) == before


def test_an_error_that_ends_the_run_is_in_the_log_too(tmp_path, monkeypatch):
    def tune(*args, **kwargs):
        raise NvblasltValueError("problems: no such file")
    monkeypatch.setattr(_tune, "tune", tune)
    log = tmp_path / "tune.log"
    assert _tune.main(["--problems", "missing.jsonl", "--log", str(log)]) == 2
    assert log.read_text().split(None, 1)[1].strip() == "nvblaslt tune stopped: problems: no such file"


def test_tune_log_refuses_a_path_it_cannot_write_before_tuning(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_tune, "tune", lambda *args, **kwargs: pytest.fail("tuned anyway"))
    assert _tune.main(["--budget", "5", "--log", str(tmp_path / "missing" / "tune.log")]) == 2
    assert "--log: cannot write" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --list runs no search: nothing to log
        _tune.main(["--list", "--log", str(tmp_path / "tune.log")])
    assert "--log: --list runs no search to log" in capsys.readouterr().err


def test_warnings_still_reach_stderr_in_a_process_that_set_up_no_logging(tmp_path):
    """Without a handler anywhere, Python prints warnings through ``logging.lastResort``; the log file's
    handler would take its place, so ``--log`` keeps one for warnings on stderr."""
    script = ("import logging, sys; from nvblaslt import _tune\n"
              "_tune.tune = lambda *a, **k: logging.getLogger('nvblaslt').warning('a database for another GPU')\n"
              "sys.exit(_tune.main(['--budget', '5', '--log', sys.argv[1]]))\n")
    log = tmp_path / "tune.log"
    done = subprocess.run([sys.executable, "-c", script, str(log)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "a database for another GPU" in done.stderr and "a database for another GPU" in log.read_text()
