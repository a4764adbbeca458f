"""`dsl lsp`: the `.clock` language server over stdio (docs/editors.md sets it up in VS Code, Neovim, Helix)."""

from __future__ import annotations

import argparse
import sys

from duplexcadence.interpreter.cli.common import EXIT_CLEAN, EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    try:
        from duplexcadence.interpreter.lsp.server import main
    except ImportError as error:
        print(
            f"dsl lsp: the language server needs pygls and lsprotocol ({error}); "
            "install them with: pip install 'duplexcadence[lsp]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    main()
    return EXIT_CLEAN


def register(commands) -> None:
    parser = commands.add_parser("lsp", help="run the .clock language server on stdin/stdout")
    parser.add_argument("--stdio", action="store_true", help="speak over stdio (the default and only transport)")
    parser.set_defaults(handler=run)
