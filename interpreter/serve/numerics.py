"""The numeric settings a tail's outputs depend on besides its inputs, so that `--verify` computes its reference
the way the server computed the outputs.

On a CPU a kernel sums in another order with another number of threads, so a stock loop run with the
checker's thread count need not equal a server's that ran with fewer (a Ray replica runs torch with the CPUs
it reserves). The server says its settings in the `ready` frame (`numerics`); `applied` sets the ones a
process can set (torch's intra-op threads, deterministic algorithms, cuDNN's flags, float32 matmul precision)
for the comparison and puts them back; `unmatched` names those it cannot (another torch, another device kind),
so that a difference they cause is said as such, never as a broken bit-identity.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import torch


@attrs.frozen
class Numerics:
    torch: str
    device: str
    threads: int
    deterministic_algorithms: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    float32_matmul_precision: str

    @classmethod
    def current(cls, device: str) -> Numerics:
        """This process's settings, for outputs computed on `device`."""
        return cls(
            torch.__version__,
            torch.device(device).type,
            torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(),
            bool(torch.backends.cudnn.deterministic),
            bool(torch.backends.cudnn.benchmark),
            torch.get_float32_matmul_precision(),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Numerics:
        return cls(**{field.name: data[field.name] for field in attrs.fields(cls)})

    def to_json(self) -> dict:
        return attrs.asdict(self)

    def describe(self) -> str:
        threads = f"{self.threads} torch thread{'s' if self.threads != 1 else ''}"
        deterministic = "on" if self.deterministic_algorithms else "off"
        return f"torch {self.torch} on {self.device}, {threads}, deterministic algorithms {deterministic}"


def unmatched(server: Numerics, device: str) -> list[str]:
    """What of the server's settings a reference computed here on `device` cannot take."""
    here = Numerics.current(device)
    found = []
    if server.torch != here.torch:
        found.append(f"the server ran torch {server.torch}, this checker torch {here.torch}")
    if server.device != here.device:
        found.append(f"the server computed on {server.device}, this checker on {here.device}")
    return found


@contextlib.contextmanager
def applied(server: Numerics) -> Iterator[None]:
    """The server's settings in this process while the block runs (the threads only for a CPU server), then
    the process's own again."""
    before = Numerics.current("cpu")
    if server.device == "cpu":
        torch.set_num_threads(server.threads)
    torch.use_deterministic_algorithms(server.deterministic_algorithms)
    torch.backends.cudnn.deterministic = server.cudnn_deterministic
    torch.backends.cudnn.benchmark = server.cudnn_benchmark
    torch.set_float32_matmul_precision(server.float32_matmul_precision)
    try:
        yield
    finally:
        torch.set_num_threads(before.threads)
        torch.use_deterministic_algorithms(before.deterministic_algorithms)
        torch.backends.cudnn.deterministic = before.cudnn_deterministic
        torch.backends.cudnn.benchmark = before.cudnn_benchmark
        torch.set_float32_matmul_precision(before.float32_matmul_precision)
