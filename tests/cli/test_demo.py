"""The main job (`bash scripts/demo.sh` runs `examples/demo.py`) on a CPU: it prints the whole plan, says
that the weights are seeded random and no audio is produced, shows what a CPU proves (bit-identity on every
frame, the plan's memory against stock) and no times or speed-up, and the GPU command."""

from __future__ import annotations

import pytest

pytest.importorskip("moshi")
torch = pytest.importorskip("torch")

from duplexcadence.examples import demo  # noqa: E402
from duplexcadence.interpreter.plans.plan import plan_file  # noqa: E402
from duplexcadence.interpreter.plans.plan_text import format_plan  # noqa: E402

pytestmark = [pytest.mark.models, pytest.mark.slow]


@pytest.fixture(scope="module")
def one_second(tmp_path_factory) -> tuple[int, str]:
    """The demo on the CPU with one second of codes (12 frames): what it prints and its exit code."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("demo")
    torch.set_num_threads(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = demo.main(["--device", "cpu", "--seconds", "1", "--out", str(out)])
    return code, printed.getvalue()


def test_it_says_what_the_weights_are_and_that_no_audio_is_produced(one_second) -> None:
    code, text = one_second
    assert code == 0
    assert text.splitlines()[:3] == [
        "DuplexCadence demo: Moshi's Mimi decoder (moshi 0.2.13, released size), on cpu",
        "The weights are seeded random and the codes random: no checkpoint is downloaded and no audio is",
        "produced. The run shows that DuplexCadence's output frames are torch.equal to moshi's own decode.",
    ]


def test_it_prints_the_whole_plan(one_second) -> None:
    _, text = one_second
    plan = plan_file(demo_clock())
    assert format_plan(plan) in text  # clocks, warm-up, every region against stock, the graphs


def test_it_shows_bit_identity_the_memory_and_that_a_cpu_captures_nothing(one_second) -> None:
    _, text = one_second
    lines = text.splitlines()
    assert (
        "== 3. stock vs DuplexCadence: 1 s of codes (12 frames: 12 of the 125 warm-up frames), torch.equal on every frame"
        in lines
    )
    header = next(i for i, line in enumerate(lines) if line.startswith("  variant "))
    assert lines[header].split() == ["variant", "state", "memory", "frames", "==", "stock", "eager"]  # no times
    table = lines[header:]
    stock, cadence = table[2].split(), table[3].split()
    assert stock == ["stock", "eager", "7.9", "MiB", "12", "(reference)"]
    assert cadence == ["duplexcadence", "7.9", "MiB", "12", "yes"]
    assert not any("ms/s" in line or "vs stock" in line for line in lines)
    assert (
        "  state memory, from the plan: stock 7.9 MiB (moshi's own buffers of the regions that declare `stock`);"
        in lines
    )
    assert "  DuplexCadence's arena 7.9 MiB (7.9 MiB pinned + 11.5 KiB scratch)" in lines
    assert (
        "  on a CPU nothing is captured (3 graphs planned, 0 captured): both variants run the same eager kernels,"
        in lines
    )
    assert "  so a CPU proves exactness and memory, not speed (no times are shown); the speed-up is CUDA-graph" in lines
    assert "    bash scripts/demo.sh --device cuda --seconds 20" in lines
    assert lines[-1] == "every output frame of duplexcadence was torch.equal to stock eager"


def test_a_cuda_device_without_cuda_and_zero_seconds_are_usage_errors(capsys) -> None:
    if not torch.cuda.is_available():
        assert demo.main(["--device", "cuda"]) == 2
        assert capsys.readouterr().err.startswith("demo: error: --device cuda: ")
    with pytest.raises(SystemExit) as stopped:
        demo.main(["--seconds", "0"])
    assert stopped.value.code == 2 and "argument --seconds: must be >= 1, not 0" in capsys.readouterr().err


def demo_clock():
    from duplexcadence.examples.moshi.cadence import clock_path

    return clock_path()


def test_without_the_moshi_packages_it_says_what_to_install(capsys, monkeypatch) -> None:
    from duplexcadence.interpreter import tails

    monkeypatch.setattr(tails, "missing_modules", lambda names: tuple(n for n in names if n == "moshi"))
    assert demo.main(["--device", "cpu", "--seconds", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "demo: error: the 'moshi' tail needs 'moshi', which is not installed: install duplexcadence[moshi] "
        "(model packages go with pip's --no-deps, so that torch stays: see the tail's README.md)",
        "  help: pip install 'duplexcadence[moshi]' && pip install --no-deps -r scripts/model-pins.txt "
        "(bash scripts/demo.sh does both)",
    ]
