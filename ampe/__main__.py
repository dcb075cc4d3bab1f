from ampe.cli import entry

entry()
