"""Ctrl-C at any moment of an ``ampe`` command: one line on stderr, exit status 130, never a traceback.

Python turns SIGINT into a ``KeyboardInterrupt`` wherever the program happens to be: inside an import, while argparse
builds the parser, inside an ``except`` clause that is printing the previous error. The command line therefore runs
in two modes:

* **quit mode** (:func:`install`, the first thing ``python -m ampe`` and the ``ampe`` script do, before the rest of
  ampe is imported): SIGINT writes ``ampe CMD: interrupted`` with one ``write`` and ends the process at once
  (``os._exit(130)``). Used while nothing needs cleaning up: imports, parsing, the checks of the arguments, and after
  the command returned (its last output is being flushed);
* **exception mode** (:func:`as_exception`, around the command itself): Python's own handler, so a command cleans
  up on ``KeyboardInterrupt`` (``ampe trial`` kills its ranks and records the trial as interrupted; commands that
  write files leave no half-written file) and the CLI prints the same one line and returns 130.

Before ampe's first line runs, Python itself answers: a Ctrl-C in its first milliseconds ends the process by the
signal (status -2, 130 in a shell, nothing printed); one while the ``site`` module imports the ``.pth`` files of the
environment (about 60 ms in an editable install, whose import finder loads ``re`` and ``pathlib``) is Python's own
"Fatal Python error: init_import_site", outside ampe's reach.

Decision: ``os._exit`` in quit mode, not ``sys.exit``: an exit that runs Python's shutdown could itself be interrupted
by a second Ctrl-C (and print a traceback); nothing buffered is worth keeping at that moment.
"""

from __future__ import annotations

import os
import signal

MYPY = False  # the typing imports cost more than the rest of the start (ampe.interrupt is imported first of all)
if MYPY:
    from typing import NoReturn

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a program Ctrl-C ended
_line = b"ampe: interrupted\n"


def quit_now(signum: int = signal.SIGINT, frame: object = None) -> NoReturn:
    """SIGINT handler in quit mode: one line on stderr, exit 130 at once."""
    try:
        os.write(2, _line)
    finally:  # also when stderr is closed: the status still says it
        os._exit(EXIT_INTERRUPTED)


def install(who: str = "ampe") -> None:
    """Enter quit mode; ``who`` starts the line (``ampe search``). Only the main thread can set a handler; elsewhere
    (an in-process caller on another thread) nothing changes, and neither does an ignored SIGINT (a background job of
    a non-interactive shell, ``nohup``: Python keeps ignoring it too)."""
    global _line
    _line = f"{who}: interrupted\n".encode(errors="replace")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return
    try:
        signal.signal(signal.SIGINT, quit_now)
    except ValueError:  # not the main thread: Python's own handling stays
        return


def installed() -> bool:
    """Whether quit mode is on (the handler of SIGINT is :func:`quit_now`)."""
    return signal.getsignal(signal.SIGINT) is quit_now


class as_exception:  # noqa: N801 - used as a function: ``with as_exception():``
    """Exception mode for the block when quit mode is on (Python's ``KeyboardInterrupt``), quit mode again after it
    — also when the block set a handler of its own (``ampe trial``'s stop requests). A no-op otherwise (tests
    calling :func:`ampe.cli.main` keep their own handler)."""

    def __enter__(self) -> None:
        self.quits = installed()
        if self.quits:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: object) -> None:
        if self.quits:
            signal.signal(signal.SIGINT, quit_now)


__all__ = ["EXIT_INTERRUPTED", "as_exception", "install", "installed", "quit_now"]
