"""The language server through its protocol: `dsl lsp` started as a subprocess, spoken to over stdio by
pygls's client (initialize, didOpen, didChange, hover, definition), with exact diagnostics, hover text
and locations."""

from __future__ import annotations

import asyncio
import sys
from importlib import resources
from pathlib import Path

import pytest

pytest.importorskip("pygls")
from lsprotocol import types
from pygls.lsp.client import LanguageClient

STDLIB_AUDIO = Path(str(resources.files("duplexcadence").joinpath("stdlib", "std", "audio.clock")))

CLEAN = """use std.audio (sample, mimi_frame)
cadence 1 s
param B = 1
clock frame = mimi_frame
clock latent = frame * 2
region codes : i64[B, 8, time] on frame input
region kv[layer < 2] : f32[2, B, 8, time, 64] on latent retain ring 250 start zeros stock 3000
    bind "layers.{layer}.cache"
region pcm : f32[B, 1, time] on sample output
stage decode on frame {
    module "decoder"
    read codes
    update kv +2
    write pcm +1920
}
"""

BROKEN = CLEAN.replace("update kv +2", "update kv +3")


class Session:
    def __init__(self) -> None:
        self.client = LanguageClient("tests", "1")
        self.diagnostics: asyncio.Queue = asyncio.Queue()

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def published(params: types.PublishDiagnosticsParams) -> None:
            self.diagnostics.put_nowait(params)

    async def start(self) -> None:
        await self.client.start_io(sys.executable, "-m", "duplexcadence.interpreter.cli.main", "lsp")
        await self.client.initialize_async(
            types.InitializeParams(capabilities=types.ClientCapabilities(), process_id=None, root_uri=None)
        )
        self.client.initialized(types.InitializedParams())

    async def next_diagnostics(self) -> types.PublishDiagnosticsParams:
        return await asyncio.wait_for(self.diagnostics.get(), timeout=60)

    async def stop(self) -> None:
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=120))


def test_diagnostics_hover_and_definition_over_stdio(tmp_path):
    path = tmp_path / "tail.clock"
    path.write_text(BROKEN)
    uri = path.as_uri()

    async def scenario():
        session = Session()
        await session.start()
        try:
            session.client.text_document_did_open(
                types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "clock", 1, BROKEN))
            )
            broken = await session.next_diagnostics()
            session.client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    types.VersionedTextDocumentIdentifier(2, uri),
                    [types.TextDocumentContentChangeWholeDocument(CLEAN)],
                )
            )
            clean = await session.next_diagnostics()
            position = lambda line, word: types.Position(line, CLEAN.split("\n")[line].index(word) + 1)  # noqa: E731
            document = types.TextDocumentIdentifier(uri)
            hovers = {}
            for line, word in ((12, "kv"), (9, "decode"), (4, "latent"), (2, "B")):
                hovers[word] = await session.client.text_document_hover_async(
                    types.HoverParams(document, position(line, word))
                )
            to_clock = await session.client.text_document_definition_async(
                types.DefinitionParams(document, position(12, "kv"))
            )
            to_stdlib = await session.client.text_document_definition_async(
                types.DefinitionParams(document, position(3, "mimi_frame"))
            )
            nothing = await session.client.text_document_hover_async(types.HoverParams(document, types.Position(1, 0)))
            return broken, clean, hovers, to_clock, to_stdlib, nothing
        finally:
            await session.stop()

    broken, clean, hovers, to_clock, to_stdlib, nothing = run(scenario())

    assert broken.uri == uri and broken.version == 1
    [problem] = broken.diagnostics
    assert problem.code == "rate-inconsistent"
    assert problem.source == "dsl check"
    assert problem.severity == types.DiagnosticSeverity.Error
    assert problem.message == (
        "stage 'decode' on clock 'frame' (12.5 Hz) updates 3 units of region 'kv' per firing, but 'kv' "
        "advances on clock 'latent' (25 Hz), i.e. 2 units per firing\n"
        "help: write `+2`, or put the region on a clock that advances 3 units per firing"
    )
    assert problem.range == types.Range(types.Position(12, 4), types.Position(12, 16))

    assert clean.version == 2 and list(clean.diagnostics) == []

    assert hovers["kv"].contents.value == (
        "**region kv (2 members, kv[0] shown)**: f32[2, 1, 8, time, 64]\n"
        "- clock `latent` at 25 Hz\n"
        "- retain ring 250, start zeros\n"
        "- bind `layers.0.cache`\n"
        "- plan: capacity 250 units, shape [2, 1, 8, 250, 64], 1000.0 KiB each, 2.0 MiB in all\n"
        "- stock: 23.4 MiB (21.5 MiB saved)"
    )
    assert hovers["decode"].contents.value == (
        "**stage decode** on `frame` (12.5 Hz): module `decoder`\n"
        "- fires 12.5 times per cadence (1 s), 25 per hyperperiod (2 s)\n"
        "- graphs: 1 (1 steady, 1 captured)"
    )
    assert hovers["latent"].contents.value == ("**clock latent**: 25 Hz, one tick every 40 ms")
    assert hovers["B"].contents.value == "**param B** = 1"
    assert nothing is None

    assert to_clock == types.Location(uri, types.Range(types.Position(6, 7), types.Position(6, 9)))
    audio_lines = STDLIB_AUDIO.read_text().split("\n")
    line = next(i for i, text in enumerate(audio_lines) if text.startswith("clock mimi_frame"))
    assert to_stdlib == types.Location(
        STDLIB_AUDIO.as_uri(), types.Range(types.Position(line, 6), types.Position(line, 16))
    )
