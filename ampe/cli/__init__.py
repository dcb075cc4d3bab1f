"""``ampe`` command line: one module per subcommand in this package, discovered at start-up.

Each subcommand module defines ``register(subparsers)`` which adds its parser and sets ``func`` (a callable taking the
parsed ``argparse.Namespace`` and returning an exit code). Bad input anywhere surfaces as
:class:`ampe.errors.InputError` and is printed here as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from ampe import __version__, interrupt
from ampe.blas import limit_threads
from ampe.errors import InputError, OutputError, os_reason

EXIT_BAD_INPUT = 2
EXIT_PIPE_CLOSED = 128 + 13  # 141: what a shell reports for a program SIGPIPE ended (`yes | head -1`)


class PipeClosed(Exception):  # noqa: N818 - an event, not an error: the reader of standard output went away
    """Standard output is a pipe whose reader has gone (EPIPE). Decision: the conventional quiet exit — no line,
    status 141 (128 + SIGPIPE), as ``cat`` or ``yes`` end under ``| head`` — and standard output pointed at
    /dev/null, so nothing fails at exit (the Python documentation's recipe). Not an InputError: no command may take
    it for bad input."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a single line (no usage dump) with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_BAD_INPUT)


ALL = "*"


def build_parser(only: str | None = ALL) -> argparse.ArgumentParser:
    """The top-level parser. ``only``: the subcommand being run; only its module is imported and registered (the
    others are left out: their help is never shown). With no or an unknown subcommand every one gets a stub with its
    one-line help, read from its module's source without importing it (so ``ampe --help`` costs about a bare Python
    start). ``ALL`` (default): every subcommand module registered."""
    parser = OneLineParser(prog="ampe", description="Heterogeneity-aware parallel-strategy and energy planner.")
    parser.add_argument("--version", action="version", version=f"ampe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    names = _subcommands()
    running = only != ALL and only in names  # a subcommand runs: the others' one-line help is never shown
    for name in names:
        if running and name != only:
            continue  # (reading their help from the sources costs a few ms)
        if only == ALL or name == only:
            module = importlib.import_module(f"{__name__}.{name}")
            register = getattr(module, "register", None)
            if register is not None:
                register(sub)
        else:
            summary = _summary(name)
            if summary is not None:
                sub.add_parser(name, help=summary)
    return parser


def _subcommands() -> list[str]:
    """Names of the subcommand modules in this package, sorted (a directory listing: pkgutil costs more to import
    than the listing takes)."""
    return sorted(f[:-3] for f in os.listdir(__path__[0])
                  if f.endswith(".py") and not f.startswith("_") and f[:-3].isidentifier())


def _summary(name: str) -> str | None:
    """The ``help=`` of ``add_parser(name, ...)`` in subcommand module ``name``, read from its source without importing
    it; None when the module registers no such subcommand. The help is one or more adjacent plain string literals,
    found with a regular expression (``re`` is loaded with argparse; parsing every module with ``ast`` doubled the
    cost of ``ampe --help``); test_cli_lazy checks it against the registered help of every subcommand."""
    with open(os.path.join(__path__[0], f"{name}.py"), encoding="utf-8") as f:
        source = f.read()
    call = re.search(r'add_parser\(\s*"' + re.escape(name) + r'"\s*,\s*help=((?:\s*"[^"\\\n]*")+)', source)
    if call is None:  # no such subcommand, or one whose help is not a plain literal
        return "" if re.search(r'add_parser\(\s*"' + re.escape(name) + '"', source) else None
    return "".join(re.findall(r'"([^"\\\n]*)"', call.group(1)))


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ampe`` console script. Standard output is guarded while it runs (:class:`GuardedStdout`):
    a write that fails there (a full disk) is one line on stderr and exit status 2, like bad input; a closed pipe is the
    quiet exit 141 (:class:`PipeClosed`)."""
    words = list(sys.argv[1:] if argv is None else argv)
    who = f"ampe {_command(words) or ''}".rstrip()
    with GuardedStdout.installed() as out:
        try:
            code = _run(words)
        except PipeClosed:  # the reader went away (`ampe --help | head -1`): quiet, as `cat` and `yes` are
            return EXIT_PIPE_CLOSED
        except OutputError as e:  # standard output failed outside a command: argparse printing its help
            sys.stderr.write(f"{who}: error: {e}\n")
            return EXIT_BAD_INPUT
        except SystemExit:  # argparse (--help, --version, a bad flag): what it printed must still arrive
            if out.flush_quietly(who):
                raise
            return out.failure_code()
        if not out.flush_quietly(who):
            return out.failure_code()
        return code


def _run(words: list[str]) -> int:
    parser = build_parser(_command(words))
    args, extra = parser.parse_known_args(words)
    if extra:
        _unrecognized(parser, args, extra)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    quits = interrupt.installed()  # Ctrl-C so far: one line and exit 130 at once (ampe.interrupt)
    try:
        with interrupt.as_exception():  # the command cleans up on KeyboardInterrupt
            _check_outputs(args)
            return int(args.func(args) or 0)
    except InputError as e:
        sys.stderr.write(f"ampe {args.command}: error: {e}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        if quits:  # the line below is the only one, whatever Ctrl-C comes next
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stderr.write(f"ampe {args.command}: interrupted\n")
        return interrupt.EXIT_INTERRUPTED


def _unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> NoReturn:
    """Refuse arguments no parser took, as the subcommand's parser (``ampe search: error: ...``) and with the
    closest of its flags (``--global-bach`` → ``--global-batch``)."""
    from ampe.errors import suggest

    owner: argparse.ArgumentParser = parser
    for action in parser._actions:  # the subcommand's own parser, when one ran
        if isinstance(action, argparse._SubParsersAction) and getattr(args, "command", None) in action.choices:
            owner = action.choices[args.command]
    flags = [f for f in owner._option_string_actions if f.startswith("--")]
    hint = ""
    first = next((w for w in extra if w.startswith("--")), None)
    if first is not None:
        close = suggest(first.split("=", 1)[0], flags)
        hint = f" (did you mean {close}?)" if close else ""
    owner.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


class GuardedStdout:
    """Standard output as the commands see it while :func:`main` runs: a write or flush that fails (ENOSPC on
    ``/dev/full``, EFBIG under a file-size limit) raises :class:`~ampe.io.OutputError` ("standard output: cannot
    write (No space left on device)"), which the command reports as one line, exit status 2; EPIPE (the reader of a
    pipe has gone) raises :class:`PipeClosed`: no line, exit status 141. After that the stream is broken: later
    writes are dropped and the file descriptor is pointed at /dev/null, so the interpreter's last flush at exit cannot
    fail a second time.

    Text a stream's encoding cannot hold (``PYTHONIOENCODING=ascii``) is written with ``?`` in its place: tables and
    messages stay readable (decision; data written with ``--out -`` is checked strictly first,
    :func:`ampe.io.write_text_atomic`)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.broken = False
        self.pipe_closed = False  # broken by EPIPE: the reader went away (PipeClosed)

    @classmethod
    @contextlib.contextmanager
    def installed(cls) -> Iterator[GuardedStdout]:
        """Put a guard in front of ``sys.stdout`` for the block (restored after it)."""
        real = sys.stdout
        guard = cls(real)
        sys.stdout = guard
        try:
            yield guard
        finally:
            if sys.stdout is guard:
                sys.stdout = real

    def write(self, text: str) -> int:
        if self.broken:
            return len(text)
        try:
            return self.raw.write(text)
        except UnicodeEncodeError:
            encoding = getattr(self.raw, "encoding", None) or "ascii"
            return self._guard(lambda: self.raw.write(text.encode(encoding, "replace").decode(encoding)))
        except OSError as e:
            self._failed(e)

    def flush(self) -> None:
        if not self.broken:
            self._guard(self.raw.flush)

    def flush_quietly(self, who: str = "ampe") -> bool:
        """Flush what is buffered; on failure say so on stderr (one line, ``who: error: ...``) and return False."""
        try:
            self.flush()
        except PipeClosed:
            return False
        except OutputError as e:
            sys.stderr.write(f"{who}: error: {e}\n")
            return False
        return not self.broken

    def failure_code(self) -> int:
        """The exit status once standard output broke: 141 for a closed pipe (quiet), else 2."""
        return EXIT_PIPE_CLOSED if self.pipe_closed else EXIT_BAD_INPUT

    def _guard(self, call: Any) -> Any:
        try:
            return call()
        except OSError as e:
            self._failed(e)

    def _failed(self, e: OSError) -> NoReturn:
        self._broke()
        if isinstance(e, BrokenPipeError):
            self.pipe_closed = True
            raise PipeClosed() from None
        raise OutputError("standard output", "", f"cannot write ({os_reason(e)})") from None

    def _broke(self) -> None:
        self.broken = True
        try:
            fd = self.raw.fileno()
        except (AttributeError, OSError, ValueError):  # not a real file (a test's capture): nothing to silence
            return
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, buffer, fileno, ...: the real stream's
        return getattr(self.raw, name)


def _check_outputs(args: argparse.Namespace) -> None:
    from ampe.cli._paths import check_paths  # the one table of every command's inputs and outputs

    check_paths(args)


def entry() -> NoReturn:
    """The ``ampe`` console script: :func:`main` with one BLAS thread (:mod:`ampe.blas`), then exit. Whatever is still
    alive is frozen first, so the interpreter's final garbage collection skips it (about 10 ms of a short run,
    measured). In-process callers of :func:`main`, such as tests, keep their environment and normal collection."""
    if not interrupt.installed():  # `python -m ampe` and the script did it already, before importing this package
        interrupt.install(f"ampe {_command(sys.argv[1:]) or ''}".rstrip())
    try:
        limit_threads()  # before any subcommand imports numpy or scipy (ampe.blas says why)
        code = main()
        gc.freeze()
    except KeyboardInterrupt:  # a Ctrl-C between two handlers (the command's and quit mode): still one line
        interrupt.quit_now()
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
