"""docs/serving.md cannot go stale: its Python runs and prints what the page says, every error code and close
code of `messages` has its row, and the byte dump of a frame is the codec's."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch

from duplexcadence.interpreter.serve import codec, messages

PAGE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
TEXT = PAGE.read_text()


def test_the_python_block_runs_and_prints_what_the_page_says():
    (block,) = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "docs/serving.md:python", "exec"), {"__name__": "serving_doc"})
    shown = re.search(r"^prints `(.*?)`\.$", TEXT, flags=re.M | re.S).group(1)
    assert printed.getvalue().strip() == " ".join(shown.split())


def test_every_error_code_and_close_code_has_its_row():
    for code in messages.ERROR_CODES:
        assert f"| `{code}` |" in TEXT, code
    for name in (
        "CLOSE_NORMAL",
        "CLOSE_GOING_AWAY",
        "CLOSE_POLICY",
        "CLOSE_INTERNAL",
        "CLOSE_TRY_AGAIN_LATER",
        "CLOSE_IDLE",
        "CLOSE_UNREAD_ANSWERS",
        "CLOSE_TOO_SLOW",
    ):
        assert f"| {getattr(messages, name)} |" in TEXT, name


def test_the_byte_dump_is_the_codec_s():
    dump = re.search(r"is 35 bytes:\n\n```\n(.*?)```", TEXT, flags=re.S).group(1)
    data = bytearray()
    for line in dump.splitlines():
        for word in line.split():
            if not re.fullmatch(r"[0-9a-f]{2}", word):
                break  # the comment
            data.append(int(word, 16))
    assert bytes(data) == codec.encode({"codes": torch.tensor([[7]])})
    for code, name in codec.DTYPE_CODES.items():
        assert f"| {code} | `{name}`" in TEXT
