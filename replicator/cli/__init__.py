"""Entry points: the `replicator` command (`main`), its `audit` subcommands and the demo."""

from replicator.cli.main import main

__all__ = ["main"]
