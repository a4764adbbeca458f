"""What every `dsl` subcommand shares: exit codes, usage errors, the common options (`-q`, `--color`,
`--format`), argparse types, `--param` pairs, `.clock` inputs (files, directories, `-`, stdlib
module names), diagnostics output, the device option and the hint for a missing optional package.

A subcommand module imports torch only inside its run function (`resolve_device` does so itself), so
that `dsl --help`, `dsl COMMAND --help` and the language commands start without it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from duplexcadence.dsl import diagnostic_text, loader, messages
from duplexcadence.dsl.diagnostics import ClockError, Diagnostic
from duplexcadence.dsl.limits import DEFAULT_LIMITS, Limits, parse_limits
from duplexcadence.dsl.limits import NAMES as LIMIT_NAMES
from duplexcadence.dsl.parse import MAX_SOURCE_BYTES
from duplexcadence.dsl.source import SourceFile

EXIT_CLEAN, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2

STDIN = "-"
STDIN_NAME = "<stdin>"
COLOR_CHOICES = ("auto", "always", "never")


class UsageError(Exception):
    """A command line that cannot run as given: `dsl COMMAND: error: MESSAGE` (and its help lines) on
    stderr, exit 2, before any work. Raise it from a run function; `main` prints it."""

    def __init__(self, message: str, helps: Sequence[str] = ()):
        super().__init__(message)
        self.message = message
        self.helps = tuple(helps)


# --- the common options --------------------------------------------------------------------------


def add_common_options(parser: argparse.ArgumentParser, top_level: bool = False) -> None:
    """`-q/--quiet` and `--color`; idempotent (an option the parser has already is left alone).

    On the top-level parser they carry the defaults; on a subcommand they default to SUPPRESS, so that
    `dsl -q check` and `dsl check -q` both work and neither overrides the other."""
    default: dict[str, Any] = {} if top_level else {"default": argparse.SUPPRESS}
    options = (
        (("-q", "--quiet"), {"action": "store_true", "help": "print the requested output and problems only"}),
        (
            ("--color",),
            {
                "choices": COLOR_CHOICES,
                "help": "colour the output: auto (default: on a terminal, unless NO_COLOR is set; "
                "FORCE_COLOR forces it), always, never",
            },
        ),
    )
    for flags, settings in options:
        with contextlib.suppress(argparse.ArgumentError):  # the command declares it itself
            parser.add_argument(*flags, **settings, **default)
    if top_level:
        parser.set_defaults(quiet=False, color="auto")


def add_output_format_option(
    parser: argparse.ArgumentParser,
    choices: Sequence[str] = ("text", "json"),
    hidden: Sequence[str] = (),
    help: str = "text (default) or json on standard output (diagnostics too)",
    default: str | None = "text",
    old_spelling: bool = True,
) -> None:
    """`--output-format` (`args.output_format`), as ruff spells it: what the command prints on standard output.
    `hidden` choices are accepted but not listed. With `old_spelling` (the commands that had it), `--format` is
    kept and marked deprecated."""
    settings: dict[str, Any] = {
        "dest": "output_format",
        "choices": (*choices, *hidden),
        "default": default,
        "metavar": "{" + ",".join(choices) + "}",
    }
    parser.add_argument("--output-format", help=help, **settings)
    if old_spelling:
        parser.add_argument("--format", help="deprecated: the old spelling of --output-format", **settings)


def add_json_path_option(parser: argparse.ArgumentParser) -> None:
    """`--json PATH`, deprecated: the JSON document written to PATH (`--output-format json > PATH` prints it)."""
    parser.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="deprecated: also write the JSON to PATH (--output-format json prints it on standard output)",
    )


def color_wanted(choice: str, stream: Any) -> bool:
    """Colour for `stream`: `--color always|never` wins; `auto` honours NO_COLOR, then FORCE_COLOR (each
    when set and not empty), then colours a terminal that is not TERM=dumb."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb":
        return False
    return hasattr(stream, "isatty") and stream.isatty()


def status(args: argparse.Namespace, message: str) -> None:
    """A line about what the command did (`wrote out.svg`), on stderr unless `-q`."""
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


# --- argparse types ------------------------------------------------------------------------------


def _integer(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= {least}, not {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least}, not {value}")
    return value


def non_negative(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _integer(text, 0)


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _integer(text, 1)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (seconds, budgets)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text}")
    return value


_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def device_name(text: str) -> str:
    """An argparse type: `cpu`, `cuda` or `cuda:N` (whether the device is there is `resolve_device`'s)."""
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, not {text!r}")
    return text


def resolve_device(choice: str | None) -> str:
    """The device to run on: `choice`, checked against this torch (imported here), or cuda when there
    is one and cpu otherwise; UsageError for a CUDA device that is not there."""
    import torch

    if choice is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice.startswith("cuda"):
        if torch.version.cuda is None:
            reason = f"this torch ({torch.__version__}) is built without CUDA"
        elif not torch.cuda.is_available():
            reason = "no CUDA device is visible"
        else:
            reason = None
            index = int(choice.partition(":")[2] or 0)
            if index >= torch.cuda.device_count():
                reason = f"there are {torch.cuda.device_count()} CUDA devices (cuda:0 to cuda:{torch.cuda.device_count() - 1})"
        if reason is not None:
            raise UsageError(
                f"--device {choice}: {reason}",
                helps=("run on the CPU with --device cpu, or install a CUDA build of torch on a machine with a GPU",),
            )
    return choice


# --- a missing optional package --------------------------------------------------------------------

# The top-level module a tail imports -> the extra that installs it.
EXTRAS = {
    "moshi": "moshi",
    "sentencepiece": "moshi",
    "safetensors": "moshi",
    "transformers": "qwen3omni",
    "tokenizers": "qwen3omni",
    "huggingface_hub": "qwen3omni",
    "stepaudio2": "minicpmo45",
    "onnxruntime": "minicpmo45",
    "scipy": "minicpmo45",
    "matplotlib": "plots",
    "starlette": "serve",
    "uvicorn": "serve",
    "websockets": "serve",
    "prometheus_client": "serve",
    "ray": "ray",
}
# What an extra needs beside it that pip cannot resolve with torch >= 2.11 (the package's own pins would
# move torch): installed with --no-deps, at the versions scripts/model-pins.txt pins.
NO_DEPS = {"moshi": "moshi==0.2.13", "minicpmo45": "stepaudio2-minicpmo==0.1.1"}
CORE = ("torch", "numpy", "lark", "attrs", "networkx", "graphviz", "rich")


def install_hint(module: str, extra: str | None = None) -> str:
    """How to install what provides the top-level `module` (`extra` when the caller knows it)."""
    top = module.partition(".")[0]
    if top in CORE and extra is None:
        return f"pip install {top} (a dependency of duplexcadence)"
    extra = extra or EXTRAS.get(top)
    if extra is None:
        return f"pip install {top}"
    hint = f'pip install "duplexcadence[{extra}]"'
    if extra in NO_DEPS:
        hint += (
            f" && pip install --no-deps {NO_DEPS[extra]} (its own pins would move torch; see scripts/model-pins.txt)"
        )
    return hint


def missing_package(error: ImportError, extra: str | None = None, what: str | None = None) -> UsageError:
    """A UsageError naming the package that is not installed and the install line."""
    module = error.name or str(error)
    subject = f"{what} needs" if what else "this command needs"
    return UsageError(
        f"{subject} the package '{module.partition('.')[0]}', which is not installed", (install_hint(module, extra),)
    )


# --- --param -------------------------------------------------------------------------------------


def parse_params(pairs: Sequence[str]) -> tuple[dict[str, str], list[Diagnostic]]:
    """`NAME=VALUE` pairs from `--param`; malformed ones become diagnostics."""
    overrides: dict[str, str] = {}
    problems: list[Diagnostic] = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip().isidentifier() or not value.strip():
            problems.append(messages.override_syntax(pair))
            continue
        overrides[name.strip()] = value.strip()
    return overrides, problems


def params_or_usage_error(pairs: Sequence[str]) -> dict[str, str]:
    """`--param` overrides; a malformed NAME=VALUE is a usage error, like an unknown option."""
    overrides, problems = parse_params(pairs)
    if problems:
        raise UsageError(problems[0].message, problems[0].helps)
    return overrides


# --- --limit -------------------------------------------------------------------------------------


def add_limit_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="raise (or lower) a limit of the program: "
        + ", ".join(f"{name}={getattr(DEFAULT_LIMITS, name)}" for name in LIMIT_NAMES)
        + " (docs/language.md, Limits)",
    )


def add_prune_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-prune",
        dest="prune",
        action="store_false",
        help="plan every stage: by default the stages no output sees, and the state only they touch, are "
        "left out (docs/language.md, Outputs and pruning)",
    )


def limits_or_usage_error(pairs: Sequence[str]) -> Limits:
    """`--limit` values; an unknown name or a value that is not a positive integer is a usage error."""
    limits, problems = parse_limits(pairs)
    if problems:
        raise UsageError(problems[0])
    return limits


# --- .clock inputs -------------------------------------------------------------------------------

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@attrs.frozen
class ClockInput:
    """One `.clock` input of a command: `path` names it in diagnostics (`<stdin>`, or the
    `--stdin-filename`, for standard input); `text` is standard input's text; `problems` say why it
    cannot be read (standard input that is not UTF-8 text, a module name that names nothing)."""

    path: str
    text: str | None = None
    problems: tuple[Diagnostic, ...] = ()

    @property
    def from_stdin(self) -> bool:
        return self.text is not None


def _display(path: Path) -> str:
    """A found module's path, relative to the current folder when it lies inside it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def is_module_name(text: str) -> bool:
    """`models.mimi_decoder`: dotted identifiers, not a `.clock` file name."""
    return "." in text and not text.endswith(".clock") and _MODULE_NAME.fullmatch(text) is not None


def module_path(name: str) -> str | None:
    """The file a stdlib-style module name (`models.mimi_decoder`) stands for, found as `use` finds
    it (the current folder, then the stdlib); None when `name` is no module name or names nothing."""
    if not is_module_name(name):
        return None
    found = loader.find_module(name.split("."), Path.cwd())
    return None if found is None else _display(found)


def _walk(folder: str) -> list[str]:
    found = []
    for root, folders, files in os.walk(folder):
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        found += [os.path.join(root, name) for name in sorted(files) if name.endswith(".clock")]
    return found


def clock_inputs(arguments: Sequence[str], walk: bool = False, stdin_filename: str | None = None) -> list[ClockInput]:
    """The inputs named on the command line, in order: `-` is standard input (once); a directory (not
    named `*.clock`) is every `*.clock` under it, sorted, hidden folders skipped (with `walk`); a path that does not exist
    but reads as a module name is that module (the current folder, then the stdlib, as `use` finds
    it); anything else is a path, which the loader reports if it cannot be read."""
    inputs: list[ClockInput] = []
    stdin_read = False
    for argument in arguments:
        if argument == STDIN:
            if stdin_read:
                raise UsageError("standard input ('-') is given twice")
            stdin_read = True
            inputs.append(read_stdin(stdin_filename or STDIN_NAME))
        elif walk and os.path.isdir(argument) and not argument.endswith(".clock"):  # x.clock names a file
            found = _walk(argument)
            if not found:
                raise UsageError(f"no .clock files in the directory '{argument}'")
            inputs += [ClockInput(path) for path in found]
        elif os.path.exists(argument):
            inputs.append(ClockInput(argument))
        elif (path := module_path(argument)) is not None:
            inputs.append(ClockInput(path))
        elif is_module_name(argument):
            inputs.append(ClockInput(argument, problems=(messages.unknown_clock(argument, loader.stdlib_modules()),)))
        else:
            inputs.append(ClockInput(argument))
    return inputs


def read_stdin(name: str) -> ClockInput:
    if hasattr(sys.stdin, "buffer"):
        data = loader.read_bounded(sys.stdin.buffer)
    else:
        data = sys.stdin.read(MAX_SOURCE_BYTES + 1).encode("utf-8")
    try:
        source = loader.source_from_bytes(name, data)
    except ClockError as error:
        return ClockInput(name, "", tuple(error.diagnostics))
    return ClockInput(name, source.text)


def add_stdin_filename_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stdin-filename",
        default=None,
        metavar="PATH",
        help="the name of standard input (`-`) in diagnostics; its `use` imports are found beside it",
    )


# --- diagnostics ---------------------------------------------------------------------------------


def print_diagnostics(
    diagnostics: Sequence[Diagnostic],
    sources: Mapping[str, SourceFile],
    fmt: str,
    color: bool,
    stream: IO[str],
    path: str | None = None,
) -> None:
    """Print diagnostics in the `full` (`text`) or `concise` form; `path` locates those without a span."""
    for diagnostic in diagnostics:
        if fmt == "concise":
            print(diagnostic_text.format_concise(diagnostic, path), file=stream)
        else:
            print(diagnostic_text.format_full(diagnostic, sources, color, path), file=stream)
            print(file=stream)


def diagnostics_json(results: Iterable[tuple[str, Iterable[Diagnostic]]]) -> str:
    """The diagnostics document of every command's `--format json` (docs/language.md, "The CLI")."""
    return diagnostic_text.to_json(results)
