"""Load-time faults: a `.clock` that does not match the model, and an arena that does not fit.

Every fault is a `ClockError` raised by `Runtime.load` before anything is allocated, carrying located
`binding-mismatch` (or `over-budget`) diagnostics that name the region or stage, the declared and the
real value, and the `.clock` line. Toy tail on CPU; Mimi (moshi's released architecture) when moshi is
installed. The device-memory check is exercised on CPU with the CUDA memory queries patched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from duplexcadence.dsl import messages
from duplexcadence.dsl.diagnostics import ClockError
from duplexcadence.examples.toy.model import build_toy, make_prompt
from duplexcadence.interpreter.runtime import runtime as runtime_module
from duplexcadence.interpreter.runtime.errors import SessionFailed
from duplexcadence.interpreter.runtime.runtime import Runtime, check_arena_fits

CLOCK = Path(__file__).resolve().parents[2] / "examples" / "toy" / "toy.clock"
TOY = CLOCK.read_text()
ATTEND_MODULE = '    module "attention"             # forward(x, cache) -> (y, new cache)\n'


def variant(tmp_path: Path, old: str, new: str) -> Path:
    """The toy clock with one edit, written beside the test."""
    assert old in TOY, old
    path = tmp_path / "toy_variant.clock"
    path.write_text(TOY.replace(old, new))
    return path


def load_error(clock: Path, model, **options) -> list:
    with pytest.raises(ClockError) as caught:
        Runtime.load(clock, model, device="cpu", **options)
    diagnostics = caught.value.diagnostics
    assert all(d.code is messages.BINDING_MISMATCH for d in diagnostics), diagnostics
    return diagnostics


def line_of(diagnostic, clock: Path) -> str:
    """The `.clock` line the diagnostic points at."""
    assert diagnostic.span is not None and diagnostic.span.path == str(clock)
    return clock.read_text().splitlines()[diagnostic.span.line - 1].strip()


# --- the model does not match ----------------------------------------------------------------------


def test_a_missing_bound_attribute_names_the_region_the_path_and_what_is_there():
    model = build_toy()
    del model.upsample.partial
    [diagnostic] = load_error(CLOCK, model)
    assert diagnostic.message == (
        "region 'partial' binds to 'upsample.partial', 'OverlapUpsample' has no attribute 'partial' (children: convtr)"
    )
    assert (
        line_of(diagnostic, CLOCK) == "region partial : f32[B, 4, time] on sample retain ring 2 start zeros "
        'bind "upsample.partial"'
    )


def test_a_missing_intermediate_module_is_named():
    model = build_toy()
    del model.encoder.conv
    [diagnostic] = load_error(CLOCK, model)
    assert diagnostic.message.startswith(
        "region 'carry' binds to 'encoder.conv.carry', 'Encoder' has no attribute 'conv'"
    )


@pytest.mark.parametrize(
    "tensor,real",
    [
        (torch.zeros(1, 4, 2, dtype=torch.float64), "f64[1, 4, 2] on cpu"),
        (torch.zeros(1, 4, 2, dtype=torch.float16), "f16[1, 4, 2] on cpu"),
        (torch.zeros(4, 2), "f32[4, 2] on cpu"),
        (torch.zeros(1, 3, 2), "f32[1, 3, 2] on cpu"),
        ([0.0, 0.0], "list"),
    ],
)
def test_a_bound_tensor_of_another_dtype_or_shape_names_declared_and_real(tensor, real):
    model = build_toy()
    model.upsample.partial = tensor
    [diagnostic] = load_error(CLOCK, model)
    assert diagnostic.message == f"region 'partial' is declared f32[1, 4, time] but 'upsample.partial' is {real}"
    assert line_of(diagnostic, CLOCK).startswith("region partial")


def test_a_param_that_disagrees_with_the_model_is_a_mismatch_of_the_regions_it_sizes():
    [diagnostic] = load_error(CLOCK, build_toy(), params={"B": 2})  # the model's state is for one stream
    assert (
        diagnostic.message
        == "region 'partial' is declared f32[2, 4, time] but 'upsample.partial' is f32[1, 4, 2] on cpu"
    )


def test_a_module_path_that_does_not_exist(tmp_path):
    clock = variant(tmp_path, ATTEND_MODULE, '    module "decoder.attention"\n')
    [diagnostic] = load_error(clock, build_toy())
    assert diagnostic.message == (
        "stage 'attend' calls 'decoder.attention', 'ToyTail' has no attribute 'decoder' "
        "(children: attention, encoder, upsample)"
    )
    assert line_of(diagnostic, clock) == 'module "decoder.attention"'


def test_a_module_path_that_is_not_callable(tmp_path):
    clock = variant(tmp_path, ATTEND_MODULE, '    module "heads"\n')
    [diagnostic] = load_error(clock, build_toy())
    assert diagnostic.message == "stage 'attend' calls 'heads', which is a int, not callable"


def test_a_hook_that_was_not_registered_says_how_to_register_it(tmp_path):
    clock = variant(tmp_path, ATTEND_MODULE, "    hook attend_window\n")
    [diagnostic] = load_error(clock, build_toy(), hooks={"attend_windows": lambda model, x, cache: None})
    assert diagnostic.message == "stage 'attend' calls hook 'attend_window', which was not registered"
    assert diagnostic.helps == (
        "did you mean 'attend_windows'?",
        "pass it to Runtime.load(..., hooks={'attend_window': function})",
    )
    assert line_of(diagnostic, clock) == "hook attend_window"


def test_every_problem_is_reported_at_once(tmp_path):
    clock = variant(tmp_path, ATTEND_MODULE, "    hook attend_window\n")
    model = build_toy()
    model.upsample.partial = torch.zeros(1, 4, 2, dtype=torch.float64)
    del model.encoder.conv.carry
    diagnostics = load_error(clock, model)
    assert sorted(d.message.split(" ")[1] for d in diagnostics) == ["'attend'", "'carry'", "'partial'"]


# --- a path stays inside the model -----------------------------------------------------------------


def unsafe_error(clock: Path, model, **options) -> list:
    with pytest.raises(ClockError) as caught:
        Runtime.load(clock, model, device="cpu", **options)
    diagnostics = caught.value.diagnostics
    assert all(d.code is messages.UNSAFE_PATH for d in diagnostics), diagnostics
    return diagnostics


def test_a_module_path_to_a_python_module_is_refused_before_anything_runs(tmp_path):
    """`dsl check` cannot see that `encoder.helpers` holds the os module; the load refuses it unwalked."""
    import os

    model = build_toy()
    model.encoder.helpers = os
    clock = variant(tmp_path, '    module "encoder"\n', '    module "encoder.helpers.abort"\n')
    [diagnostic] = unsafe_error(clock, model)
    assert diagnostic.message == (
        "stage 'encode' calls 'encoder.helpers.abort', whose 'helpers' is the Python module 'os': "
        "a path stays inside the model"
    )
    assert line_of(diagnostic, clock) == 'module "encoder.helpers.abort"'


def test_a_module_path_to_a_plain_function_is_refused(tmp_path):
    model = build_toy()
    model.encoder.activation = torch.nn.functional.gelu
    clock = variant(tmp_path, '    module "encoder"\n', '    module "encoder.activation"\n')
    [diagnostic] = unsafe_error(clock, model)
    assert (
        "whose 'activation' is the builtin_function_or_method 'gelu', not a module of the model" in diagnostic.message
    )


def test_a_method_is_called_only_when_bound_to_the_object_its_path_reaches(tmp_path):
    model = build_toy()
    model.encoder.borrowed = model.attention.forward  # a method of another module, kept as an attribute
    clock = variant(tmp_path, '    module "encoder"\n', '    module "encoder.borrowed"\n')
    [diagnostic] = unsafe_error(clock, model)
    assert "whose 'borrowed' is the method 'WindowAttention.forward', not a module of the model" in diagnostic.message
    own = variant(tmp_path, '    module "encoder"\n', '    module "encoder.forward"\n')
    Runtime.load(own, build_toy(), device="cpu")  # its own method: allowed


def test_a_binding_through_a_class_is_refused_before_anything_is_set(tmp_path):
    model = build_toy()
    model.upsample.kind = type(model.upsample)
    clock = variant(tmp_path, 'bind "upsample.partial"', 'bind "upsample.kind.partial"')
    [diagnostic] = unsafe_error(clock, model)
    assert diagnostic.message == (
        "region 'partial' binds to 'upsample.kind.partial', whose 'kind' is the class 'OverlapUpsample': "
        "a path stays inside the model"
    )


def test_a_dunder_path_that_bypassed_the_check_is_refused_at_load(tmp_path):
    """A Program edited by hand never reaches a module's globals: nothing is called or overwritten."""
    import attrs

    from duplexcadence.dsl.frontend import load_program

    program = load_program(CLOCK)
    stages = dict(program.stages)
    stages["encode"] = attrs.evolve(stages["encode"], target="__class__.__init__.__globals__.torch.os.getpid")
    regions = dict(program.regions)
    regions["carry"] = attrs.evolve(regions["carry"], bind="__class__.__init__.__globals__.CAUSAL")
    program = attrs.evolve(program, stages=stages, regions=regions)
    diagnostics = unsafe_error(program, build_toy())
    assert sorted(d.message for d in diagnostics) == [
        "region 'carry' binds to '__class__.__init__.__globals__.CAUSAL', whose '__class__' is a dunder attribute: "
        "a path stays inside the model",
        "stage 'encode' calls '__class__.__init__.__globals__.torch.os.getpid', whose '__class__' is a dunder "
        "attribute: a path stays inside the model",
    ]


def test_the_shipped_paths_through_plain_state_objects_still_bind():
    """Plain objects holding state (moshi's `_streaming_state`, PersonaPlex's carries) may be walked through."""
    from duplexcadence.interpreter.runtime.binding import attribute

    class State:
        def __init__(self):
            self.cache = torch.zeros(2)

    model = build_toy()
    model.encoder._streaming_state = State()
    model.encoder.carries = {0: State()}
    assert attribute(model, "encoder._streaming_state.cache").get() is model.encoder._streaming_state.cache
    assert attribute(model, "encoder.carries.0.cache").get() is model.encoder.carries[0].cache


# --- the call does not fit the callable ------------------------------------------------------------


def test_a_module_called_with_one_argument_too_many_is_refused_at_load(tmp_path):
    clock = variant(
        tmp_path,
        "    read hidden\n    write attended +1\n",
        "    read hidden\n    read hidden\n    write attended +1\n",
    )
    [diagnostic] = load_error(clock, build_toy())
    assert diagnostic.message == (
        "stage 'attend' calls module 'attention' as (hidden, hidden, cache), but it is "
        "WindowAttention.forward(x, cache): too many positional arguments"
    )
    assert line_of(diagnostic, clock).startswith('module "attention"')


def test_a_module_called_with_a_keyword_it_does_not_take_is_refused_at_load(tmp_path):
    clock = variant(
        tmp_path, "    read hidden\n    write attended +1\n", "    read hidden as query\n    write attended +1\n"
    )
    [diagnostic] = load_error(clock, build_toy())
    assert diagnostic.message == (
        "stage 'attend' calls module 'attention' as (cache, query=hidden), but it is "
        "WindowAttention.forward(x, cache): missing a required argument: 'cache'"
    )


def test_a_hook_missing_a_parameter_is_refused_at_load(tmp_path):
    clock = variant(tmp_path, ATTEND_MODULE, "    hook attend\n")

    def attend(model, x):  # forgot the cache
        return model.attention(x, None)

    [diagnostic] = load_error(clock, build_toy(), hooks={"attend": attend})
    assert diagnostic.message == (
        "stage 'attend' calls hook 'attend' as (model, hidden, cache), but it is "
        "test_a_hook_missing_a_parameter_is_refused_at_load.<locals>.attend(model, x): "
        "too many positional arguments"
    )


def test_hooks_that_fit_load_with_or_without_the_firing(tmp_path):
    clock = variant(tmp_path, ATTEND_MODULE, "    hook attend\n")
    hooks = [
        lambda model, x, cache: model.attention(x, cache),
        lambda model, x, cache, *, firing: model.attention(x, cache),
        lambda model, *args, **kwargs: model.attention(*args),
    ]
    for hook in hooks:
        model = build_toy()
        runtime = Runtime.load(clock, model, device="cpu", hooks={"attend": hook})
        session = runtime.session(initial={"cache": make_prompt(model, 6)})
        assert session.step(codes=torch.zeros(1, 1, dtype=torch.int64)).shape == (1, 4, 2)


def test_a_call_that_fails_inside_an_uninspectable_callable_names_the_stage_and_its_arguments(tmp_path):
    """A hook taking `*args` cannot be judged at load; its TypeError at the first step says what the
    stage was called with."""
    clock = variant(tmp_path, ATTEND_MODULE, "    hook attend\n")
    model = build_toy()
    runtime = Runtime.load(
        clock, model, device="cpu", hooks={"attend": lambda model, *args: model.attention(*args[:1])}
    )
    session = runtime.session(initial={"cache": make_prompt(model, 6)})
    with pytest.raises(SessionFailed) as caught:
        session.step(codes=torch.zeros(1, 1, dtype=torch.int64))
    text = str(caught.value)
    assert text.startswith(
        "stage 'attend' (hook 'attend' called as (model, hidden f32[1, 32, 1], "
        "cache f32[2, 1, 4, 6, 8])) raised at instant 0: TypeError("
    )
    assert "missing 1 required positional argument: 'cache'" in text


# --- the arena does not fit ------------------------------------------------------------------------


def fake_cuda_memory(monkeypatch, free: int, reserved: int = 0, allocated: int = 0) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated)


def test_an_arena_over_the_free_device_memory_says_needed_and_available(monkeypatch):
    runtime = Runtime.load(CLOCK, build_toy(), device="cpu", sessions=3)
    plan = runtime.plan
    needed = plan.arena.total_bytes(3)
    fake_cuda_memory(monkeypatch, free=needed - 1000, reserved=600, allocated=200)
    with pytest.raises(ClockError) as caught:
        check_arena_fits(plan, 3, torch.device("cuda", 0))
    [diagnostic] = caught.value.diagnostics
    assert diagnostic.code is messages.BUDGET
    assert diagnostic.message == (
        f"the arena for 3 sessions needs {needed} bytes (3 x {plan.arena.session_bytes} per session + "
        f"{plan.arena.scratch_bytes} shared scratch) but cuda:0 has {needed - 600} bytes available "
        f"({needed - 1000} free + 400 cached by PyTorch); nothing was allocated"
    )
    fake_cuda_memory(monkeypatch, free=needed - 1000, reserved=1200, allocated=200)
    check_arena_fits(plan, 3, torch.device("cuda", 0))  # the allocator's cache makes up the difference
    check_arena_fits(plan, 3, torch.device("cpu"))  # the host has room for three toy sessions


def test_runtime_load_refuses_before_allocating_anything(monkeypatch):
    """On a (pretended) CUDA device with too little memory, Runtime.load raises before the arena, the
    graph pool or any session exists."""
    fake_cuda_memory(monkeypatch, free=1024)
    monkeypatch.setattr(runtime_module, "resolve_device", lambda device: torch.device("cuda", 0))

    def no_allocation(*args, **kwargs):
        raise AssertionError("the arena was allocated")

    monkeypatch.setattr(runtime_module, "DeviceArena", no_allocation)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", no_allocation)
    with pytest.raises(ClockError, match=r"but cuda:0 has 1024 bytes available \(1024 free \+ 0 cached"):
        Runtime.load(CLOCK, build_toy(), sessions=2)


def test_an_allocation_that_fails_anyway_is_the_same_clear_error(monkeypatch):
    fake_cuda_memory(monkeypatch, free=2**40)
    monkeypatch.setattr(runtime_module, "resolve_device", lambda device: torch.device("cuda", 0))

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate ...")

    monkeypatch.setattr(runtime_module, "DeviceArena", out_of_memory)
    with pytest.raises(ClockError, match=r"the arena for 1 session needs \d+ bytes .* nothing was allocated"):
        Runtime.load(CLOCK, build_toy(), graphs=False)


# --- Mimi ------------------------------------------------------------------------------------------


@pytest.mark.models
def test_mimi_loaded_for_another_batch_names_every_bound_state():
    pytest.importorskip("moshi")
    from duplexcadence.examples.moshi import model as mimi_model
    from duplexcadence.examples.moshi.cadence import HOOKS, clock_path

    mimi = mimi_model.build_mimi(seed=1234)
    mimi.streaming_forever(1)
    with pytest.raises(ClockError) as caught:
        Runtime.load(clock_path(), mimi, params={"B": 2}, hooks=HOOKS, device="cpu")
    messages_by_region = {d.message.split("'")[1]: d.message for d in caught.value.diagnostics}
    bound = {
        name
        for name, region in Runtime.load(
            clock_path(), mimi, params={"B": 1}, hooks=HOOKS, device="cpu"
        ).program.regions.items()
        if region.bind
    }
    assert set(messages_by_region) == bound
    assert messages_by_region["kv[0]"] == (
        "region 'kv[0]' is declared f32[2, 2, 8, time, 64] but 'decoder_transformer.transformer.layers.0.self_attn."
        "_streaming_state.kv_cache.cache' is f32[2, 1, 8, 250, 64] on cpu"
    )
    assert all(d.span is not None and d.span.path.endswith("mimi_decoder.clock") for d in caught.value.diagnostics)


def test_a_session_whose_graph_capture_raises_leaves_its_slot_free(monkeypatch):
    """An error while a new session captures its graphs (a CUDA error, say) is raised as it is, and the
    slot stays free: the next session() gets it."""
    model = build_toy()
    runtime = Runtime.load(CLOCK, model, device="cpu", sessions=2)
    free = list(runtime.free_slots)

    def broken(session, strategy):
        raise RuntimeError("CUDA error: out of memory")

    runtime.graphs_enabled = True  # as on CUDA, where each new slot captures its graphs
    monkeypatch.setattr(runtime_module, "capture_slot", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        runtime.session(initial={"cache": make_prompt(model, 6)})
    assert runtime.free_slots == free and runtime.sessions == []
    runtime.graphs_enabled = False
    session = runtime.session(initial={"cache": make_prompt(model, 6)})
    assert session.slot == free[0]
