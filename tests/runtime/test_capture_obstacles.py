"""What keeps a stage out of a CUDA graph, found in one warm-up run and reported per kind, with its count per
firing and what to do (capture/obstacles.py).

On the CPU: the counting (a TorchDispatchMode sees `.item()` on the device it is told to watch, and a copy
to the `meta` device stands for a host-to-device copy), the diagnostics' text, the probe of a session's
stage (a caller-owned tensor outside the arena, a counter's host value that changes between replays), and
how `runtime.report()` and `dsl bench` show them. On CUDA (marked gpu): a runtime whose stage reads device
values three times and copies a constant each call runs it eagerly, reports both, and stays bit-identical.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from duplexcadence.examples.toy.encoder import build_encoder, new_cache
from duplexcadence.interpreter.bench import Subject, Variant, format_table, run
from duplexcadence.interpreter.runtime.capture.graphs import probe_stage
from duplexcadence.interpreter.runtime.capture.obstacles import diagnostics_of, find_obstacles, sync_warnings_in
from duplexcadence.interpreter.runtime.errors import CaptureWarning
from duplexcadence.interpreter.runtime.runtime import Runtime


def syncing(x: torch.Tensor) -> torch.Tensor:
    for _ in range(3):
        x = x * x.amax().item()
    if x.sum() > 0:  # bool() of a device value
        x = x + 1
    x = x[x > 2] if x.numel() > 99 else x + x.nonzero().sum()
    return x


def test_host_reads_and_data_sized_operations_are_counted_per_call():
    found = find_obstacles(lambda: syncing(torch.arange(4.0)), "cpu")
    assert [(o.operation, o.count) for o in found] == [
        (
            "reads a device value on the host (aten._local_scalar_dense: .item(), int(), float(), bool(), "
            "`if tensor:`, .tolist())",
            4,
        ),
        ("runs an operation whose output size depends on the data (nonzero), which waits for the device", 1),
    ]
    assert find_obstacles(lambda: torch.arange(4.0) * 2, "cpu") == []


def test_a_compiled_function_stays_compiled_after_the_probe_calls_it(counting_backend):
    """Under the probe's TorchDispatchMode every guard of a compiled function fails (the mode adds `Python` to
    each tensor's dispatch key set), and dynamo, which does not compile under a dispatch mode, would mark the
    code object skipped for good: every later call in the process would run eagerly. The probe runs it
    eagerly and leaves dynamo as it was."""
    counting, compiled_calls = counting_backend

    def rotate(x, offset):
        return torch.sin(x + offset) * torch.cos(x - offset)

    rotate_compiled = torch.compile(rotate, backend=counting)
    x, offset = torch.arange(4.0), torch.ones(1)
    rotate_compiled(x, offset)
    assert len(compiled_calls) == 1
    assert find_obstacles(lambda: rotate_compiled(x, offset), "cpu") == []
    assert len(compiled_calls) == 1  # the probe ran it eagerly
    rotate_compiled(x, offset)
    assert len(compiled_calls) == 2  # and it is still compiled after the probe


def test_only_sync_debug_reports_count_as_host_synchronisations():
    """torch warns once per process, when sync-debug mode is first set, that the mode is a prototype; that
    warning names "synchronizing operations" too, and must not block the first stage probed in a process."""
    prototype = (
        "Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations "
        "(Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)"
    )
    assert sync_warnings_in([prototype]) == 0
    assert sync_warnings_in([prototype, "called a synchronizing CUDA operation", "a UserWarning"]) == 1
    assert sync_warnings_in(["called a synchronizing CUDA operation"] * 3) == 3


def test_host_to_device_copies_are_counted_with_a_fake_device():
    def constants() -> None:
        torch.tensor([0.5]).to("meta")
        torch.ones(3).to("meta")
        torch.empty(2, device="meta").copy_(torch.ones(2))

    [copy] = find_obstacles(constants, "meta")
    assert copy.operation == (
        "copies host memory to the device (_to_copy x2, copy_: a CPU tensor .to(device), torch.tensor(..., device=...))"
    )
    assert copy.count == 3
    assert find_obstacles(constants, "cpu") == []  # on the CPU nothing is a copy to a device


def test_one_located_diagnostic_per_obstacle():
    [first, second] = diagnostics_of("speak", find_obstacles(lambda: syncing(torch.arange(4.0)), "cpu"), None)
    assert first.code.name == "capture-blocked"
    assert first.message == (
        "stage 'speak' cannot be captured: reads a device value on the host (aten._local_scalar_dense: .item(), "
        "int(), float(), bool(), `if tensor:`, .tolist()), 4 times per firing"
    )
    assert first.helps == (
        "keep the value on the device (torch.where instead of `if`, a shape instead of a value); a hook that "
        "needs a step count takes `firing` and reads firing.count or firing.counters",
        "the stage runs eagerly, outputs unchanged",
    )
    assert second.message.endswith("(nonzero), which waits for the device, once per firing")


CLOCK = """
cadence 1 s
clock frame = 12.5 Hz
object state from make_state
counter tick +1 on frame
counter phase +1 mod 25 on frame
region x : f32[1, 4, time] on frame input
region y : f32[1, 4, time] on frame output
stage s on frame {
    hook speak
    read x
    read state
    write y +1
}
"""


class State:
    def __init__(self):
        self.gain = torch.full((1, 4, 1), 2.0)  # caller-owned, and no region: outside the arena


def speak(model, x, state, firing):
    x = syncing(x) * state.gain
    return x + firing.counters["tick"] + firing.counters["phase"]


def test_the_probe_of_a_session_stage_reports_everything_at_once(tmp_path):
    path = tmp_path / "speak.clock"
    path.write_text(CLOCK)
    runtime = Runtime.load(path, None, hooks={"speak": speak, "make_state": lambda model: State()}, device="cpu")
    session = runtime.session()
    found = probe_stage(session, runtime.plan.trace.firings[0])
    assert [(o.operation, o.count) for o in found[1:]] == [
        ("runs an operation whose output size depends on the data (nonzero), which waits for the device", 1),
        ("reads state.gain, a caller-owned tensor outside the arena, whose address a graph would keep", 1),
        ("uses counter 'tick' as a Python int (firing.counters), whose value changes between replays of one graph", 0),
    ]  # `phase` repeats every hyperperiod (25 frames, mod 25): its host value is right at every replay
    [*_, counter] = diagnostics_of("s", found, runtime.program.stages["s"].span)
    assert counter.message.endswith("whose value changes between replays of one graph")
    assert counter.span.line == 9  # the stage's line in the .clock
    assert counter.helps[0].startswith("read the counter's device scalar in captured code (`read tick`")


@pytest.mark.parametrize(
    "copied",
    [
        lambda counters: dict(counters),
        lambda counters: {**counters},
        lambda counters: counters.copy(),
        lambda counters: counters | {},
        lambda counters: {} | counters,
        lambda counters: dict(counters.items()),
    ],
    ids=["dict", "unpacked", "copy", "or", "ror", "items"],
)
def test_a_hook_that_copies_the_counters_is_seen_using_them(tmp_path, copied):
    def speak_from_a_copy(model, x, state, firing):
        return x + copied(firing.counters)["tick"]

    path = tmp_path / "speak.clock"
    path.write_text(CLOCK)
    hooks = {"speak": speak_from_a_copy, "make_state": lambda model: State()}
    runtime = Runtime.load(path, None, hooks=hooks, device="cpu")
    found = probe_stage(runtime.session(), runtime.plan.trace.firings[0])
    assert [o.operation for o in found] == [
        "uses counter 'tick' as a Python int (firing.counters), whose value changes between replays of one graph"
    ]


def test_a_counter_bound_as_a_python_int_where_the_stage_sees_it_is_an_obstacle():
    runtime = Runtime.load("examples/toy/encoder.clock", build_encoder(), hooks={"new_cache": new_cache}, device="cpu")
    session = runtime.session()
    found = probe_stage(session, runtime.plan.trace.firings[5])
    assert [o.operation for o in found] == [
        "uses counter 'step' as a Python int (bind cache \"step\"), whose value changes between replays of one graph"
    ]


def test_the_report_and_the_bench_show_each_obstacle_located(tmp_path):
    path = tmp_path / "speak.clock"
    path.write_text(CLOCK)
    runtime = Runtime.load(path, None, hooks={"speak": speak, "make_state": lambda model: State()}, device="cpu")
    session = runtime.session()
    diagnostics = diagnostics_of(
        "s", probe_stage(session, runtime.plan.trace.firings[0]), runtime.program.stages["s"].span
    )
    runtime.blocked["s"], runtime.obstacles["s"] = diagnostics[0], tuple(diagnostics)  # what capture records on CUDA
    text = str(runtime.report())
    assert text.count("  blocked: stage 's' cannot be captured: ") == 4
    assert f"4 times per firing ({path}:9:1)" in text
    session.close()
    x = torch.ones(1, 4, 1)
    subject = Subject(
        "speak",
        12.5,
        lambda tick: {"x": x},
        [Variant("duplexcadence", runtime.session, reference=True)],
        torch.device("cpu"),
    )
    table = format_table(subject, run(subject, ticks=3))
    assert f"  duplexcadence: {path}:9:1: stage 's' cannot be captured: reads a device value on the host" in table


@pytest.mark.gpu
def test_on_cuda_a_stage_with_obstacles_runs_eagerly_reports_each_and_stays_equal(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    clock = """
cadence 1 s
clock frame = 12.5 Hz
region x : f32[1, 4, time] on frame input
region h : f32[1, 4, time] on frame retain scratch
region y : f32[1, 4, time] on frame output
stage read_back on frame {
    hook read_back
    read x
    write h +1
}
stage scale on frame {
    hook scale
    read h
    write y +1
}
"""

    def read_back(model, x):
        for _ in range(3):
            x = x / (1 + x.abs().amax().item())
        return x * torch.tensor([0.5]).to(x.device)

    def scale(model, h):
        return h * 3

    path = tmp_path / "obstacles.clock"
    path.write_text(clock)
    runtime = Runtime.load(path, None, hooks={"read_back": read_back, "scale": scale}, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = runtime.session()
    assert any(issubclass(w.category, CaptureWarning) for w in caught)
    blocked = [d.message for d in runtime.report().blocked]
    assert blocked[0].startswith("stage 'read_back' cannot be captured: reads a device value on the host")
    assert blocked[0].endswith("3 times per firing")
    assert "copies host memory to the device" in blocked[1] and blocked[1].endswith("once per firing")
    assert "scale" not in runtime.blocked  # the other stage is captured
    generator = torch.Generator().manual_seed(0)
    for _ in range(30):
        x = torch.randn(1, 4, 1, generator=generator).cuda()
        assert torch.equal(session.step(x=x), scale(None, read_back(None, x)))
