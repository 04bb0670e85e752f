"""The `gridtune` command line: recommend, predict, sweep, presets, profile, calibrate, serve, db, train,
validate.

This package is the composition root: the only one that imports tuner, api, engine and validation
together (see docs/architecture.md; tests/test_layering.py enforces it). Run it as `gridtune ...`
or `python -m cli ...`.

Each subcommand lives in its own module with `register(subparsers)`. `main` imports only the module
of the command it runs: the others stand in the parser as their name and one-line help
(`COMMANDS`), all that `gridtune --help` shows, so `gridtune --version` and `gridtune --help` load
no numpy, and `gridtune recommend` none of what the other commands need (scipy's fits, pandas, the
service, torch). Within a module, what only some paths need is imported inside the handler.
tests/test_startup.py checks both. Errors from bad input print one line (`gridtune: error: ...`) and
exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Collection, Sequence

# name -> the line `gridtune --help` shows; each module's register() gives its parser the same help
# (tests/test_startup.py compares them), so the listing reads the same whichever modules are loaded.
COMMANDS = {
    "recommend": "rank every layout and show the best",
    "predict": "predict one layout's step time, memory and traffic",
    "sweep": "best layout over GPU counts or batch sizes, with a scaling plot",
    "presets": "list model, cluster, GPU (and stack) presets",
    "profile": "measure collectives/GEMMs on this cluster (or import nccl-tests) and fit the model's "
               "constants",
    "calibrate": "fit your stack's constants on your cluster to measured runs",
    "serve": "run the REST service (predict, recommend, clusters, measurements)",
    "db": "database schema: upgrade to the newest migration",
    "train": "train a built-in example with engine.train (auto or --plan)",
    "validate": "profile, predict, run and compare every plan on this machine",
}
SUBCOMMANDS = tuple(COMMANDS)


class _Version(argparse.Action):
    """`--version`, read when asked: importlib.metadata costs every other command ~50 ms."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **_: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: object, values: object,
                 option_string: str | None = None) -> None:
        parser._print_message(f"gridtune {_version()}\n", sys.stdout)
        parser.exit()


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The `gridtune` parser. `load`: the subcommands whose modules are imported to add their options
    (None: all of them); any other appears by name and help only, enough for `gridtune --help` and
    for argparse's "invalid choice" message, not for parsing its own arguments."""
    parser = argparse.ArgumentParser(
        prog="gridtune",
        description="Find the fastest 4D-parallel layout for training a model on a GPU cluster.",
        epilog="`gridtune COMMAND --help` shows each command's options and defaults; "
               "`gridtune presets` lists the model, cluster and GPU names.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in COMMANDS.items():
        if load is None or name in load:
            importlib.import_module(f"cli.{name}").register(sub)
        else:
            sub.add_parser(name, help=text, add_help=False)
    return parser


def requested_command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` runs: its first word that is not an option (`gridtune` itself takes only
    -h/--help and --version, neither with a value); None when there is none."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("gridtune")
    except Exception:  # running from a source tree that was never installed
        from api import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(load={requested_command(argv)} & set(COMMANDS))
    args = parser.parse_args(argv)
    try:
        code = args.handler(args)
    except ValueError as exc:
        print(f"gridtune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gridtune: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
