"""What `dsl check` reads: regular files only, never more than the size limit, modules only inside their
search roots, and names a file system can hold.

Each case is something a user (or a script) can hand to `dsl check`: a FIFO named `x.clock` must not
block, a device must not be read until memory runs out, a `use` whose name no file can have must be
a located diagnostic, and a `use` that resolves through a symbolic link out of its folder must be
refused without a byte of the outside file reaching the output.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from duplexcadence.dsl import messages
from duplexcadence.dsl.frontend import check_file
from duplexcadence.dsl.parse import MAX_SOURCE_BYTES
from duplexcadence.interpreter.cli import main as cli

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, devices and links of POSIX")


def dsl_check(capsys, *files: str) -> tuple[int, str]:
    code = cli.main(["check", "--output-format", "concise", *files])
    out, err = capsys.readouterr()
    assert err == "" and "Traceback" not in out
    return code, out


@posix_only
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("pipe.clock")
    code, out = dsl_check(capsys, "pipe.clock")
    assert code == 1
    assert out.splitlines()[0] == (
        "pipe.clock: error: cannot read 'pipe.clock': it is a FIFO (a named pipe), not a regular file [unreadable-file]"
    )


@posix_only
def test_a_device_is_refused_before_anything_is_read(capsys):
    code, out = dsl_check(capsys, "/dev/zero")
    assert code == 1
    assert out.splitlines()[0] == (
        "/dev/zero: error: cannot read '/dev/zero': it is a character device, not a regular file [unreadable-file]"
    )


def test_a_directory_named_like_a_module_is_refused_where_it_is_imported(tmp_path):
    (tmp_path / "shared.clock").mkdir()
    main = tmp_path / "main.clock"
    main.write_text("use shared\ncadence 1 s\n")
    [diagnostic] = check_file(main).diagnostics
    assert diagnostic.code is messages.UNREADABLE
    assert diagnostic.message == f"cannot read module 'shared' ('{tmp_path / 'shared.clock'}'): it is a directory"
    assert (diagnostic.span.line, diagnostic.span.column) == (1, 5)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_the_size_limit_counts_the_bytes_read_not_the_size_reported(tmp_path):
    """`/proc` files report a size of 0; what is read decides (at most the limit + 1 bytes)."""
    [diagnostic] = check_file("/proc/self/status").diagnostics
    assert diagnostic.code is messages.SYNTAX  # read (it is small), parsed, refused as text
    big = tmp_path / "big.clock"
    big.write_text("# padding\n" * (MAX_SOURCE_BYTES // 10 + 1))
    [diagnostic] = check_file(big).diagnostics
    assert diagnostic.message == (
        f"cannot read '{big}': it is {MAX_SOURCE_BYTES + 10} bytes, over the {MAX_SOURCE_BYTES}-byte limit for a .clock file"
    )


def test_standard_input_is_read_up_to_the_limit(capsys, monkeypatch):
    class Endless:
        """A stream that never ends, like `yes | dsl check -`."""

        def __init__(self):
            self.read_bytes = 0

        def read(self, size: int = -1) -> bytes:
            assert size > 0, "an unbounded read of standard input"
            self.read_bytes += size
            return b"#" * size

    stream = Endless()
    monkeypatch.setattr(sys, "stdin", type("Stdin", (), {"buffer": stream})())
    code, out = dsl_check(capsys, "-")
    assert code == 1
    assert out.splitlines()[0] == (
        f"<stdin>: error: cannot read '<stdin>': it holds more than the {MAX_SOURCE_BYTES}-byte limit "
        "for a .clock file [unreadable-file]"
    )
    assert stream.read_bytes == MAX_SOURCE_BYTES + 1


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        (
            "a" * 300,
            "its part '" + "a" * 24 + "..." + "a" * 24 + "' is 300 characters, too long for a file name (255 bytes)",
        ),
        (
            ".".join(["b" * 200] * 25),
            "its file would be a path of",
        ),
    ],
)
def test_a_use_no_file_can_match_is_a_located_diagnostic(tmp_path, name, problem):
    main = tmp_path / "main.clock"
    main.write_text(f"cadence 1 s\nuse {name}\n")
    [diagnostic] = check_file(main).diagnostics
    assert diagnostic.code is messages.UNKNOWN_IMPORT
    assert diagnostic.message.startswith("no module '") and problem in diagnostic.message
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 5)


def test_a_module_name_on_the_command_line_that_no_file_can_have(capsys):
    code, out = dsl_check(capsys, "a" * 300 + ".b")
    assert code == 1 and "no such file, nor a module of that name" in out


@posix_only
def test_a_use_through_a_link_out_of_its_folder_is_refused_unread(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("the first line of a file outside the project\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "leak.clock").symlink_to(outside)
    (project / "lib").symlink_to(tmp_path, target_is_directory=True)
    main = project / "main.clock"
    main.write_text("cadence 1 s\nuse leak\nuse lib.secret\n")
    (tmp_path / "secret.clock").write_text("param p = 1\n")
    result = check_file(main)
    assert [d.message for d in result.diagnostics] == [
        f"cannot read module 'leak' ('{project / 'leak.clock'}'): it is a symbolic link out of '{project}', "
        "where `use` looks for it",
        f"cannot read module 'lib.secret' ('{project / 'lib' / 'secret.clock'}'): it is a symbolic link out of "
        f"'{project}', where `use` looks for it",
    ]
    assert [(d.span.line, d.span.column) for d in result.diagnostics] == [(2, 5), (3, 5)]
    assert set(result.sources) == {str(main)}  # nothing outside was read


@posix_only
def test_a_link_that_stays_inside_the_folder_is_followed(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "rates.clock").write_text("clock frame = 12.5 Hz\n")
    (tmp_path / "rates.clock").symlink_to(tmp_path / "shared" / "rates.clock")
    main = tmp_path / "main.clock"
    main.write_text("cadence 1 s\nuse rates\nparam p = 1\n")
    assert check_file(main).ok
