"""Where the library's diagnostics go: the library logs one-line notes (the energy planning's coarsening, a cluster
re-plan's search that fits nothing) at INFO on its module loggers under ``ampe``; a command installs this handler for
the call that makes them and prints each line as it chooses (the search: on stderr after its progress bar)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class _Lines(logging.Handler):
    """Each record's message, as one line, to ``emit``."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._emit_line = emit

    def emit(self, record: logging.LogRecord) -> None:
        self._emit_line(record.getMessage())


@contextmanager
def diagnostics(emit: Callable[[str], None]) -> Iterator[None]:
    """While inside, every record logged under the ``ampe`` logger at INFO or above goes to ``emit(line)``.

    Args:
        emit: prints one line (e.g. ``print``).
    """
    logger = logging.getLogger("ampe")
    handler = _Lines(emit)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
