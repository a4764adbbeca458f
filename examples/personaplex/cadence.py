"""PersonaPlex's Mimi decoder tail under DuplexCadence: the stdlib clock bound to the reproduction.

`stdlib/models/personaplex_mimi_decoder.clock` declares the state of one PersonaPlex Mimi instance
(:class:`~.stock.PersonaPlexMimiDecoder`: old moshi's cat-rebuilt conv carries, convtr partials,
ring KV caches with one `end_offset` [1], offsets [1]). :class:`PersonaPlexCadenceModel` is what the
runtime binds: the reproduction's own decoder (its arithmetic untouched) plus small, value-identical
adjustments that make its state bindable:

* `carries`: the decoder's carry objects under their module paths (`carries.decoder.model.3.block.1`
  is the `ConvCarry` of `decoder.model.3.block.1`), since the decoder keys them by dotted names;
* every conv's one-time left padding (`padding_to_add`) is 0: the runtime hands a zero `previous`
  from the first tick, and `cat([zeros, x])` is the same values as old moshi's `F.pad(x)` with no
  carry (tested `torch.equal`). A host-side flag would also differ between sessions of one model;
* the kernel-1 convs' and the StreamingAdds' carries are always zero-length (they carry nothing;
  stock keeps them as views that pin a copy of their whole input): the SEANet hook keeps them
  `None`, so old moshi takes its no-carry branch (same values, no copy) and checks after each
  firing that they are still empty.

The transformer hook calls the decoder transformer directly (the reproduction's `CUDAGraphed` is
bypassed: the runtime captures its own graphs); the SEANet hook runs under `no_compile()` as stock.

PersonaPlex decodes every tick with two Mimi instances loaded from one checkpoint (`mimi` and
`other_mimi` in its `server.py`). Every tensor those instances keep is declared, and the only host
state left (`offset_cpu` counters) is never read on the decode path, so the two instances are served
as two sessions of ONE runtime over ONE model (:class:`PersonaPlexCadenceTail`): one copy of the
weights instead of two, each session's state in its own arena slot, each slot with its own graphs.
With `lanes=2` the two sessions are in two lanes and each tick steps them with `Runtime.step_many`:
their graphs replay concurrently on two CUDA streams (stock runs the instances one after another).
With `lockstep=True` the two instances are the two rows of ONE session at B=2
(:class:`~duplexcadence.interpreter.runtime.lockstep.LockstepGroup`): one replay per tick decodes both. The
instances are always in lockstep (same tick, same reset), which the old code's one `end_offset` per
batch needs. The rows are computed by kernels chosen for batch 2, so whether they equal the batch-1
stock instances is a property of the device's kernels, measured in docs/benchmarks.md; opt-in.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import torch
from moshi.utils.compile import no_compile

from duplexcadence.examples.personaplex.stock import AddCarry, ConvCarry, PersonaPlexMimiDecoder
from duplexcadence.interpreter.runtime.lockstep import LockstepGroup, Member
from duplexcadence.interpreter.runtime.runtime import Runtime
from duplexcadence.interpreter.runtime.session import Session


def clock_path() -> Path:
    return Path(str(resources.files("duplexcadence").joinpath("stdlib", "models", "personaplex_mimi_decoder.clock")))


def _insert(tree: dict, path: str, value: Any) -> None:
    """Put `value` at a dotted module path; numeric parts become int keys (the binding indexes with them)."""
    keys = [int(part) if part.isdigit() else part for part in path.split(".")]
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if keys[-1] in node:
        raise ValueError(f"two carries at {path}")
    node[keys[-1]] = value


class PersonaPlexCadenceModel:
    """One PersonaPlex Mimi instance as the runtime binds it (see the module docstring)."""

    def __init__(self, mimi, batch_size: int = 1) -> None:
        self.decoder = PersonaPlexMimiDecoder(mimi, batch_size, graph_transformer=False)
        self.empty_carries: list[ConvCarry | AddCarry] = list(self.decoder.adds.values())
        for carry in self.decoder.convs.values():
            if carry.initial_padding == 0:  # kernel 1: keeps k - 1 = 0 inputs
                self.empty_carries.append(carry)
            carry.initial_padding = carry.padding_to_add = 0
        self.carries: dict = {}
        for name, carry in (*self.decoder.convs.items(), *self.decoder.conv_transposes.items()):
            _insert(self.carries, name, carry)
        for name, carry in self.decoder.adds.items():
            _insert(self.carries, f"{name}.add", carry)

    def clear_empty_carries(self) -> None:
        """Set the always-empty carries back to None; raise if one ever held something."""
        for carry in self.empty_carries:
            for field in ("previous",) if isinstance(carry, ConvCarry) else ("previous_x", "previous_y"):
                value = getattr(carry, field)
                if value is not None and value.shape[-1] != 0:
                    raise RuntimeError(f"a carry declared empty holds {tuple(value.shape)}: {carry}")
                setattr(carry, field, None)


def personaplex_codes_to_latent(model: PersonaPlexCadenceModel, codes: torch.Tensor) -> torch.Tensor:
    """Codebook decode and the 2x upsample (its `partial` bound): codes [B, 8, 1] -> latent [B, 2, 512]
    (time-major, the layout of the upsample's own output: see the clock file)."""
    decoder = model.decoder
    latent = decoder.mimi.decode_latent(codes)
    return decoder._conv_transpose("upsample.convtr", decoder.mimi.upsample.convtr, latent).transpose(1, 2)


def personaplex_decoder_transformer(model: PersonaPlexCadenceModel, latent: torch.Tensor) -> torch.Tensor:
    """The decoder transformer (ring KV and offsets bound): latent [B, 2, 512] -> latent [B, 2, 512]; the
    stock code runs it on the [B, 512, 2] view."""
    (latent,) = model.decoder._run_decoder_transformer(latent.transpose(1, 2))
    return latent.transpose(1, 2)


def personaplex_seanet_decoder(model: PersonaPlexCadenceModel, latent: torch.Tensor) -> torch.Tensor:
    """The SEANet decoder, eager ops as stock (conv carries and convtr partials bound): latent [B, 2, 512]
    (run on its [B, 512, 2] view, as stock) -> PCM [B, 1, 1920]."""
    model.clear_empty_carries()
    with no_compile():
        pcm = model.decoder._run_seanet_decoder(latent.transpose(1, 2))
    model.clear_empty_carries()
    return pcm


HOOKS = {
    "personaplex_codes_to_latent": personaplex_codes_to_latent,
    "personaplex_decoder_transformer": personaplex_decoder_transformer,
    "personaplex_seanet_decoder": personaplex_seanet_decoder,
}


def load_runtime(
    mimi,
    batch_size: int = 1,
    device: str | torch.device | None = None,
    sessions: int = 1,
    graphs: bool | str = "auto",
    max_graphs: int | None = None,
    lanes: int = 1,
) -> Runtime:
    """A runtime for one PersonaPlex Mimi instance's decode tail over `mimi`'s weights.

    Each session is one instance (its own KV rings, carries and offsets). `mimi` is a moshi 0.2.13
    `MimiModel` (see `duplexcadence.examples.moshi.model.build_mimi`); it is not put in streaming mode.
    """
    from duplexcadence.examples.moshi.model import materialize_codebook_tables

    device = device or next(mimi.parameters()).device
    materialize_codebook_tables(mimi)  # eagerly, so no capture ever creates a codebook table
    model = PersonaPlexCadenceModel(mimi, batch_size)
    return Runtime.load(
        clock_path(),
        model,
        params={"B": batch_size},
        device=device,
        hooks=HOOKS,
        sessions=sessions,
        graphs=graphs,
        max_graphs=max_graphs,
        lanes=lanes,
    )


class PersonaPlexCadenceTail:
    """PersonaPlex's two-instance tail on DuplexCadence: two sessions of one runtime over one Mimi.

    `step(codes)` decodes one tick with both instances, as `server.py` does (main PCM first, then
    other_mimi's, which the server discards); it returns (main PCM, other PCM), like
    :meth:`~.stock.PersonaPlexTail.step`. With `lanes=2` the instances are in two lanes and are
    stepped together by `Runtime.step_many` (concurrently, on two CUDA streams). With `lockstep=True`
    they are the two rows of one B=2 session, decoded by one replay (batch 1 only; not with lanes).
    """

    def __init__(
        self,
        mimi,
        batch_size: int = 1,
        device: str | torch.device | None = None,
        graphs: bool | str = "auto",
        max_graphs: int | None = None,
        lanes: int = 1,
        lockstep: bool = False,
    ) -> None:
        self.lanes = lanes
        self.group: LockstepGroup | None = None
        if lockstep:
            if batch_size != 1 or lanes != 1:
                raise ValueError(
                    f"lockstep=True decodes the two instances of one batch-1 stream as the rows of one "
                    f"B=2 session: it takes batch_size=1 and lanes=1, not {batch_size} and {lanes}"
                )
            self.runtime = load_runtime(mimi, 2, device=device, sessions=1, graphs=graphs, max_graphs=max_graphs)
            self.group = LockstepGroup(self.runtime)
            self.main: Session | Member = self.group.join()
            self.other: Session | Member = self.group.join()
            return
        self.runtime = load_runtime(
            mimi, batch_size, device=device, sessions=2, graphs=graphs, max_graphs=max_graphs, lanes=lanes
        )
        self.main = self.runtime.session()
        self.other = self.runtime.session()

    def step(self, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.group is not None:
            outputs = self.group.step({self.main: codes, self.other: codes})
            return outputs[self.main], outputs[self.other]
        if self.lanes > 1:
            outputs = self.runtime.step_many({self.main: {"codes": codes}, self.other: {"codes": codes}})
            return outputs[self.main], outputs[self.other]
        return self.main.step(codes=codes), self.other.step(codes=codes)

    def reset(self) -> None:
        """A new conversation: both instances back to their start (the server's reset_streaming)."""
        if self.group is not None:
            self.group.reset()
            return
        self.main.reset()
        self.other.reset()

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            return
        self.main.close()
        self.other.close()
