"""The `.clock` language server on pygls: diagnostics as you type, hover, go to definition.

Diagnostics are the front end's (`dsl check`'s code, wording, notes and helps), ranged by their
spans; hover shows the plan's numbers for a region, a clock, a stage or a param; go to definition
finds the declaration of a name in the file or in a module it `use`s (the stdlib included).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from duplexcadence.dsl.diagnostics import Diagnostic, Severity
from duplexcadence.dsl.source import Span
from duplexcadence.interpreter.lsp.analysis import Analysis, analyse, definition_of, hover_text, word_at

SERVER_NAME = "duplexcadence-clock"
SOURCE = "dsl check"


def path_of(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def uri_of(path: str) -> str:
    return Path(path).resolve().as_uri() if not urlparse(path).scheme else path


def lsp_range(span: Span) -> types.Range:
    """A 1-based, end-exclusive span as a 0-based LSP range."""
    return types.Range(
        start=types.Position(line=span.line - 1, character=span.column - 1),
        end=types.Position(line=span.end_line - 1, character=max(span.end_column - 1, span.column - 1)),
    )


def lsp_diagnostic(diagnostic: Diagnostic, path: str) -> types.Diagnostic:
    span = diagnostic.span if diagnostic.span is not None and diagnostic.span.path == path else None
    related = [
        types.DiagnosticRelatedInformation(
            location=types.Location(uri=uri_of(note.span.path), range=lsp_range(note.span)), message=note.message
        )
        for note in diagnostic.notes
        if note.span is not None
    ]
    message = diagnostic.message
    if diagnostic.span is not None and span is None:  # in an imported file: say where
        message = f"{diagnostic.span}: {message}"
    extra = [note.message for note in diagnostic.notes if note.span is None] + [f"help: {h}" for h in diagnostic.helps]
    if extra:
        message += "\n" + "\n".join(extra)
    return types.Diagnostic(
        range=lsp_range(span) if span is not None else types.Range(types.Position(0, 0), types.Position(0, 0)),
        message=message,
        severity=types.DiagnosticSeverity.Error
        if diagnostic.severity is Severity.ERROR
        else types.DiagnosticSeverity.Warning,
        code=diagnostic.code.name,
        source=SOURCE,
        related_information=related or None,
    )


class ClockServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(SERVER_NAME, "0.1.0", text_document_sync_kind=types.TextDocumentSyncKind.Full)
        self.analyses: dict[str, Analysis] = {}

    def refresh(self, uri: str) -> None:
        document = self.workspace.get_text_document(uri)
        path = path_of(uri)
        analysis = analyse(path, document.source)
        self.analyses[uri] = analysis
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=uri,
                version=document.version,
                diagnostics=[lsp_diagnostic(d, path) for d in analysis.diagnostics],
            )
        )

    def analysis(self, uri: str) -> Analysis:
        if uri not in self.analyses:
            self.refresh(uri)
        return self.analyses[uri]


def build_server() -> ClockServer:
    server = ClockServer()

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: ClockServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.refresh(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: ClockServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.refresh(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: ClockServer, params: types.DidSaveTextDocumentParams) -> None:
        ls.refresh(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: ClockServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.analyses.pop(params.text_document.uri, None)
        ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[])
        )

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(ls: ClockServer, params: types.HoverParams) -> types.Hover | None:
        analysis = ls.analysis(params.text_document.uri)
        name = word_at(analysis.text, params.position.line + 1, params.position.character + 1)
        text = hover_text(analysis, name) if name else None
        if text is None:
            return None
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=text))

    @server.feature(types.TEXT_DOCUMENT_DEFINITION)
    def definition(ls: ClockServer, params: types.DefinitionParams) -> types.Location | None:
        analysis = ls.analysis(params.text_document.uri)
        name = word_at(analysis.text, params.position.line + 1, params.position.character + 1)
        found = definition_of(analysis, name) if name else None
        if found is None:
            return None
        uri = params.text_document.uri if found.span.path == analysis.path else uri_of(found.span.path)
        return types.Location(uri=uri, range=lsp_range(found.span))

    return server


def main() -> None:
    build_server().start_io()
