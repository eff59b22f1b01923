"""``nvblaslt tune --log FILE`` without a GPU: the search's log written where asked, the package's logger left
as it was, and a path it cannot write refused before any tuning."""

from __future__ import annotations

import logging

import pytest

from nvblaslt import _tune


def test_tune_log_writes_the_search_log_and_leaves_the_logger_as_it_was(tmp_path, monkeypatch):
    package_logger = logging.getLogger("nvblaslt")
    before = (list(package_logger.handlers), package_logger.level)

    def tune(*args, **kwargs):  # what a search logs, by both ways the package logs
        logging.getLogger("nvblaslt").info("search: kept %s", "id 66 tile 128x64")
        from nvblaslt._logging import logger
        logger.info("confirmation: %s at %.4f× the first pick", "id 66", 0.9731)
    monkeypatch.setattr(_tune, "tune", tune)
    log = tmp_path / "tune.log"
    assert _tune.main(["--problems", str(tmp_path / "p.jsonl"), "--budget", "5", "--log", str(log)]) == 0
    lines = log.read_text().splitlines()
    assert [line.split(None, 1)[1] for line in lines] == ["search: kept id 66 tile 128x64",
                                                          "confirmation: id 66 at 0.9731× the first pick"]
    assert all(line.split()[0].isdigit() for line in lines)  # milliseconds since the start
    assert (list(package_logger.handlers), package_logger.level) == before


def test_tune_log_refuses_a_path_it_cannot_write_before_tuning(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_tune, "tune", lambda *args, **kwargs: pytest.fail("tuned anyway"))
    assert _tune.main(["--budget", "5", "--log", str(tmp_path / "missing" / "tune.log")]) == 2
    assert "--log: cannot write" in capsys.readouterr().err
