"""The `gridtune` command line: recommend, predict, sweep, presets, profile, calibrate, serve, db, train,
validate.

This package is the composition root: the only one that imports tuner, api, engine and validation
together (see docs/architecture.md; tests/test_layering.py enforces it). Run it as `gridtune ...`
or `python -m cli ...`.

Each subcommand lives in its own module with `register(subparsers)`; heavy imports (torch,
uvicorn) happen inside the handlers, so `gridtune recommend` starts fast. Errors from bad input
print one line (`gridtune: error: ...`) and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ("recommend", "predict", "sweep", "presets", "profile", "calibrate", "serve", "db", "train",
               "validate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gridtune",
        description="Find the fastest 4D-parallel layout for training a model on a GPU cluster.",
        epilog="`gridtune COMMAND --help` shows each command's options and defaults; "
               "`gridtune presets` lists the model, cluster and GPU names.",
    )
    parser.add_argument("--version", action="version", version=f"gridtune {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"cli.{name}").register(sub)
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("gridtune")
    except Exception:  # running from a source tree that was never installed
        from api import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
