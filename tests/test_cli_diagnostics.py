"""The library logs its diagnostics; the CLI's handler prints them, only while a command runs."""

from __future__ import annotations

import logging

from ampe.cli._diagnostics import diagnostics


def test_library_notes_reach_the_command_while_it_runs_and_not_after():
    lines: list[str] = []
    ampe_log = logging.getLogger("ampe")
    before = (list(ampe_log.handlers), ampe_log.level)
    with diagnostics(lines.append):
        logging.getLogger("ampe.search.cluster_replan").info("%s: no strategy fits", "full search")
        logging.getLogger("ampe.energy.ranking").debug("not a diagnostic")  # below INFO: dropped
        logging.getLogger("elsewhere").info("not ampe's")
    logging.getLogger("ampe.energy.ranking").info("after the command")
    assert lines == ["full search: no strategy fits"]
    assert (list(ampe_log.handlers), ampe_log.level) == before
