"""`dsl bench TAIL`: every variant of a tail side by side in one process (the API: `duplexcadence.interpreter.bench`).

TAIL is a registered tail (`duplexcadence.interpreter.tails.available()`) or a subject of your own,
`MODULE:FUNCTION`: a function in a module importable from the current folder (or from the installed
packages) that takes the options below as keywords (`device`, `seconds`, `batch`, `dtype`, and every
`--option KEY=VALUE`) and returns a `bench.Subject`. `--compile` adds the subject's `compile_variants`
(torch.compile reduce-overhead of the stock step), run last; one that fails is reported as failed.

Torch and the bench are imported by `run` only, so that `dsl --help` starts without them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from duplexcadence.interpreter import tails
from duplexcadence.interpreter.cli.common import (
    EXIT_CLEAN,
    EXIT_PROBLEMS,
    UsageError,
    add_json_path_option,
    add_output_format_option,
    device_name,
    positive,
    positive_float,
    resolve_device,
    status,
)

if TYPE_CHECKING:
    from duplexcadence.interpreter.bench import Subject, Variant

DEFAULT_COMPILE_BUDGET_S = 150.0  # duplexcadence.interpreter.bench.DEFAULT_COMPILE_BUDGET_S, without importing torch


def _options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option {pair!r} is not KEY=VALUE", helps=("e.g. --option steps=5",))
        options[key] = value
    return options


def subject_function(name: str) -> Callable[..., Any] | str:
    """The `subject` of the registered tail `name`, or FUNCTION of `MODULE:FUNCTION`; else an error message."""
    if name in tails.available():
        try:
            tail = tails.get(name)
            tail.require()
            return tail.subject.resolve()
        except tails.TailError as error:
            return str(error)
    module_name, sep, function_name = name.partition(":")
    if not sep or not module_name or not function_name:
        registered = ", ".join(tails.available()) or "none registered"
        return f"'{name}' is neither a registered tail ({registered}) nor MODULE:FUNCTION (a subject of your own, e.g. mybench:subject)"
    try:
        return tails.import_function(module_name, function_name)
    except tails.ImportFailed as error:
        return str(error)


def run(args: argparse.Namespace) -> int:
    make_subject = subject_function(args.tail)
    if isinstance(make_subject, str):
        raise UsageError(make_subject)
    options = _options(args.option)
    device = resolve_device(args.device)  # imports torch
    from duplexcadence.interpreter import bench

    try:
        subject = make_subject(device=device, seconds=args.seconds, batch=args.batch, dtype=args.dtype, **options)
    except ValueError as error:  # an option the subject does not take (a dtype, a batch for a mode)
        raise UsageError(f"{args.tail}: {error}") from None
    if args.variants is not None:
        chosen = select_variants(subject, args.variants)
        if isinstance(chosen, str):
            raise UsageError(f"{subject.name}: {chosen}")
        subject.variants = chosen
    ticks = int(subject.ticks_per_second * args.seconds)
    if args.compile and not subject.compile_variants:
        print(f"dsl bench: {subject.name} declares no torch.compile variant; --compile adds nothing", file=sys.stderr)
    results = bench.run(
        subject,
        ticks,
        progress=not args.no_progress,
        compile=args.compile,
        compile_budget_s=args.compile_budget,
        interleave=args.interleave,
        trace_dir=args.trace,
    )
    if args.output_format == "json":
        print(json.dumps(bench.to_json(subject, results), indent=1, sort_keys=True, default=str))
    else:
        print(bench.format_table(subject, results))
    if args.json:
        bench.dump(args.json, bench.to_json(subject, results))
        status(args, f"wrote {args.json}")
    identical = all(r.bit_identical is not False for r in results if "duplexcadence" in r.name)
    return EXIT_CLEAN if identical else EXIT_PROBLEMS


def select_variants(subject: Subject, names: str) -> list[Variant] | str:
    """`--variants A,B`: the subject's reference variant (stock eager, which bit-identity is checked
    against), then A and B in that order; or an error message naming the variants there are."""
    by_name = {variant.name: variant for variant in subject.variants}
    wanted, unknown = split_variant_names(names, by_name)
    if unknown or not wanted:
        return (
            f"--variants {names!r}: {'no variant named ' + repr(unknown[0]) if unknown else 'names no variant'}; "
            f"the variants are {', '.join(repr(name) for name in by_name)}"
        )
    reference = [variant for variant in subject.variants if variant.reference]
    return reference + [by_name[name] for name in dict.fromkeys(wanted) if not by_name[name].reference]


def split_variant_names(names: str, known: Iterable[str]) -> tuple[list[str], list[str]]:
    """`names` split at its commas into known variant names -> (the names, the pieces that name none).
    A variant's own name may hold commas (`duplexcadence, 2 lanes`): at each piece the longest run of
    pieces that spells a known name (spaces around the commas aside) is taken."""
    spelled = {_comma_key(name): name for name in known}
    longest = max((key.count(",") + 1 for key in spelled), default=1)
    pieces = [piece.strip() for piece in names.split(",")]
    wanted: list[str] = []
    unknown: list[str] = []
    start = 0
    while start < len(pieces):
        for count in range(min(longest, len(pieces) - start), 0, -1):
            name = spelled.get(",".join(pieces[start : start + count]))
            if name is not None:
                wanted.append(name)
                start += count
                break
        else:
            if pieces[start]:
                unknown.append(pieces[start])
            start += 1
    return wanted, unknown


def _comma_key(name: str) -> str:
    return ",".join(part.strip() for part in name.split(","))


def register(commands) -> None:
    parser = commands.add_parser("bench", help="benchmark a model tail: stock variants vs DuplexCadence")
    registered = ", ".join(tails.available()) or "none registered"
    parser.add_argument(
        "tail",
        metavar="TAIL",
        help=f"a registered tail ({registered}) or MODULE:FUNCTION, a subject of your own importable from the "
        "current folder",
    )
    parser.add_argument(
        "--device", type=device_name, default=None, help="cpu, cuda or cuda:N (default: cuda when present)"
    )
    parser.add_argument("--seconds", type=positive, default=10, help="duplex seconds to stream per variant")
    parser.add_argument("--batch", type=positive, default=1, help="sessions decoded together (B)")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="tail-specific option (e.g. steps=5 for minicpmo45)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also run the stock step under torch.compile(mode='reduce-overhead') (slow: compiles; "
        "a variant that fails is reported as failed)",
    )
    parser.add_argument(
        "--compile-budget",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help=f"wall-clock budget of each compile variant (default {DEFAULT_COMPILE_BUDGET_S:g})",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="then time the variants again, all built at once and stepped in turn each tick, so "
        "that drift of the machine over the run is shared (needs every variant's memory "
        "at once; compile variants are left out)",
    )
    parser.add_argument(
        "--variants",
        default=None,
        metavar="NAME,NAME",
        help="run only these variants, in this order, after the reference (stock eager, always "
        "first): the order matters on a GPU, see docs/benchmarks.md; a name may hold commas "
        "('duplexcadence, 2 lanes')",
    )
    parser.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="write each variant's profile of its last ticks to DIR as a Chrome trace (per-operation GPU "
        "timeline; the host's operations too), with a summary line per variant",
    )
    add_output_format_option(
        parser,
        help="text (default: the table) or json (the results, as docs/benchmarks/*.json hold them)",
        old_spelling=False,
    )
    add_json_path_option(parser)
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(handler=run)
