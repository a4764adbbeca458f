"""Writing a view: DOT text (the `graphviz` package alone) or SVG, PNG and PDF through Graphviz's `dot`
program, whose absence is reported with how to install it."""

from __future__ import annotations

from pathlib import Path

import graphviz

FORMATS = ("dot", "svg", "png", "pdf")
SUFFIX_FORMATS = {".dot": "dot", ".gv": "dot", ".svg": "svg", ".png": "png", ".pdf": "pdf"}

INSTALL_DOT = (
    "install Graphviz: `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` "
    "(macOS), or see https://graphviz.org/download/; or write DOT text with `--output-format dot`, "
    "which needs no extra program"
)


class RenderError(Exception):
    """A render that cannot be written (no `dot`, `dot` failed, unknown format); a one-line message."""


class DotMissing(RenderError):
    """Graphviz's `dot` program is not on PATH."""


def output_format(output: str | Path | None, fmt: str | None) -> str:
    """The format to write: `fmt` if given (it must agree with the output's suffix), else the suffix's."""
    suffix = Path(output).suffix.lower() if output is not None else ""
    implied = SUFFIX_FORMATS.get(suffix)
    if fmt is not None:
        if fmt not in FORMATS:
            raise RenderError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        if implied is not None and implied != fmt:
            raise RenderError(
                f"the output {output} ends in {suffix} but --output-format is {fmt}; drop one or make them agree"
            )
        return fmt
    if output is None:
        return "dot"
    if implied is None:
        raise RenderError(
            f"cannot tell the format from {output!r}: end it in .dot, .svg, .png or .pdf, or give --output-format"
        )
    return implied


def to_bytes(graph: graphviz.Digraph, fmt: str) -> bytes:
    """DOT text (no extra program needed) or the output of Graphviz's `dot` for svg/png/pdf."""
    if fmt == "dot":
        return graph.source.encode("utf-8")
    try:
        return graph.pipe(format=fmt, quiet=True)
    except graphviz.ExecutableNotFound:
        raise DotMissing(
            f"writing {fmt} needs Graphviz's `dot` program, which is not on PATH; " + INSTALL_DOT
        ) from None
    except graphviz.CalledProcessError as error:
        detail = (error.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise RenderError(f"`dot` failed to write {fmt}: " + (detail[-1] if detail else str(error))) from None


def write_output(data: bytes, output: str | Path) -> None:
    try:
        Path(output).write_bytes(data)
    except OSError as error:
        raise RenderError(f"cannot write {output}: {error.strerror or error}") from None
