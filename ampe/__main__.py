"""``python -m ampe`` and the ``ampe`` console script. Ctrl-C is answered with one line and exit 130 from here on
(:mod:`ampe.interrupt`), before the command line's own modules are imported."""

from __future__ import annotations

import sys

from ampe.interrupt import install


def entry() -> None:
    """Quit mode for Ctrl-C, then :func:`ampe.cli.entry` (which exits)."""
    install(_who(sys.argv[1:]))
    from ampe.cli import entry as run

    run()


def _who(words: list[str]) -> str:
    """``ampe`` and the subcommand named (its first word that is not an option), as error lines start."""
    command = next((w for w in words if not w.startswith("-")), "")
    return f"ampe {command}".rstrip() if command.isidentifier() else "ampe"


if __name__ == "__main__":
    entry()
