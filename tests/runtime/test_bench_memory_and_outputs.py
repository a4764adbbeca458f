"""The bench against stock: a variant's peak allocated or reserved memory above stock eager's is flagged
(table and JSON), and a variant that produces only some of stock's outputs is compared on those (`Variant.outputs`)."""

from __future__ import annotations

import json

import attrs
import torch

from duplexcadence.interpreter import bench, tails

TOY = tails.get("toy")
MiB = 1 << 20


def measured(
    name: str, peak: int | None, workspace: int | None = None, reserved: int | None = None
) -> bench.VariantResult:
    memory = None if peak is None else {"peak_bytes": peak, "cublas_workspace_bytes": workspace}
    reserved = peak if reserved is None else reserved
    return bench.VariantResult(
        name, 10.0, 10.0, 10.0, 0.8, None, None, peak, reserved, None, 0.0, True, None, 25, {}, memory=memory
    )


def test_a_peak_over_stock_eagers_is_flagged_in_the_table_and_the_json() -> None:
    """Qwen3-Omni's Code2Wav, bf16, B=1 on an H100: stock eager 536.6 / 562 MiB, DuplexCadence 569.0 / 618 MiB
    (peak allocated / reserved); a variant over stock in reserved memory only is flagged too."""
    results = [
        measured("stock eager", 537 * MiB, 32 * MiB, reserved=562 * MiB),
        measured("duplexcadence", 569 * MiB, 32 * MiB, reserved=618 * MiB),
        measured("smaller", 500 * MiB, 32 * MiB, reserved=530 * MiB),
        measured("level", 537 * MiB, 32 * MiB, reserved=562 * MiB),
        measured("reserving", 530 * MiB, 32 * MiB, reserved=600 * MiB),
    ]
    stock = {"stock_variant": "stock eager"}
    assert bench.memory_over_stock(results) == [
        {"variant": "duplexcadence", "kind": "allocated", "peak_bytes": 569 * MiB, **stock}
        | {"stock_peak_bytes": 537 * MiB, "over_bytes": 32 * MiB},
        {"variant": "duplexcadence", "kind": "reserved", "peak_bytes": 618 * MiB, **stock}
        | {"stock_peak_bytes": 562 * MiB, "over_bytes": 56 * MiB},
        {"variant": "reserving", "kind": "reserved", "peak_bytes": 600 * MiB, **stock}
        | {"stock_peak_bytes": 562 * MiB, "over_bytes": 38 * MiB},
    ]
    subject = TOY.subject(device="cpu", seconds=1)
    lines = [line for line in bench.format_table(subject, results).splitlines() if "over stock" in line]
    assert lines == [
        "  duplexcadence: peak allocated 569.0 MiB, over stock by 32.0 MiB (stock eager: 537.0 MiB); a cuBLAS "
        "workspace is 32.0 MiB here, one per stream that runs cuBLAS",
        "  duplexcadence: peak reserved 618.0 MiB, over stock by 56.0 MiB (stock eager: 562.0 MiB)",
        "  reserving: peak reserved 600.0 MiB, over stock by 38.0 MiB (stock eager: 562.0 MiB)",
    ]
    payload = json.loads(json.dumps(bench.to_json(subject, results)))
    assert [(e["variant"], e["kind"], e["over_bytes"]) for e in payload["memory_over_stock"]] == [
        ("duplexcadence", "allocated", 32 * MiB),
        ("duplexcadence", "reserved", 56 * MiB),
        ("reserving", "reserved", 38 * MiB),
    ]


def test_without_a_measured_peak_nothing_is_flagged() -> None:
    """Off CUDA there is no peak allocated: no line, an empty list."""
    results = [measured("stock eager", None), measured("duplexcadence", None)]
    assert bench.memory_over_stock(results) == []
    table = bench.format_table(TOY.subject(device="cpu", seconds=1), results)
    assert "over stock" not in table
    assert bench.to_json(TOY.subject(device="cpu", seconds=1), results)["memory_over_stock"] == []


def test_a_failed_variant_is_not_flagged() -> None:
    failed = attrs.evolve(measured("duplexcadence", None), error="RuntimeError: boom", ms_per_s_median=None)
    assert bench.memory_over_stock([measured("stock eager", 537 * MiB), failed]) == []


def test_a_variant_is_compared_on_the_outputs_it_produces() -> None:
    """A variant that returns only some of stock's outputs: `outputs` names them, the others are not
    compared (missing), and a wrong value among them is still a mismatch."""
    made = TOY.subject(device="cpu", seconds=1)
    reference = next(v for v in made.variants if v.reference)

    class Partial:
        def __init__(self, shift: float) -> None:
            self.inner = reference.make()
            self.shift = shift

        def reset(self) -> None:
            self.inner.reset()

        def step(self, **inputs):
            result = self.inner.step(**inputs)
            result = result if isinstance(result, dict) else {"output": result}
            return {"output": result["output"] + self.shift}

    def both(**inputs):
        result = reference_runner.step(**inputs)
        result = result if isinstance(result, dict) else {"output": result}
        return {"output": result["output"], "extra": torch.zeros(1)}

    reference_runner = reference.make()

    class Reference:
        def reset(self) -> None:
            reference_runner.reset()

        step = staticmethod(both)

    made.variants = [
        bench.Variant("stock eager", Reference, reference=True),
        bench.Variant("only output", lambda: Partial(0.0), outputs=("output",)),
        bench.Variant("only output, wrong", lambda: Partial(0.5), outputs=("output",)),
        bench.Variant("missing extra", lambda: Partial(0.0)),
    ]
    results = bench.run(made, 3, progress=False, profile=False)
    verdicts = {r.name: (r.bit_identical, r.first_mismatch is not None) for r in results}
    assert verdicts == {
        "stock eager": (True, False),
        "only output": (True, False),
        "only output, wrong": (False, True),
        "missing extra": (False, True),
    }
    assert results[1].info["compared_outputs"] == ["output"]
    assert "compared_outputs" not in results[3].info
