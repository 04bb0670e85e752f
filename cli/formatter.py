"""How every `gridtune COMMAND --help` is laid out. Its own module, standard library only, so that
the commands whose help needs nothing else (serve, db, train, validate, presets, profile) register
without importing the model (cli.common imports perfmodels, hence numpy)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in descriptions as written and shows each default once: "(default: X)" is
    added where an option has a default and its help does not already say one (no "(default: None)",
    nothing for on/off flags)."""

    @staticmethod
    def _shows_default(action: argparse.Action) -> bool:
        default = action.default
        return not (
            default is None
            or default is argparse.SUPPRESS
            or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
            or default == []
        )

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or not self._shows_default(action):
            return text
        return f"{text} (default: %(default)s)".lstrip()

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self._shows_default(action):  # an option without help still says its default
            import copy

            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)
