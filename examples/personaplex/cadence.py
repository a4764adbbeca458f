"""PersonaPlex's Mimi decoder tail under DuplexCadence: the stdlib clock bound to the reproduction.

`stdlib/models/personaplex_mimi_decoder.clock` declares what PersonaPlex's server decodes every tick: the
same tokens through two Mimi instances (`mimi` and `other_mimi` in its `server.py`), each with its own
state (:class:`~.stock.PersonaPlexMimiDecoder`: old moshi's cat-rebuilt conv carries, convtr partials, ring
KV caches with one `end_offset` [1], offsets [1]); `mimi`'s PCM is the output, `other_mimi`'s a region
nothing reads. The plan proves `other_mimi`'s three stages unobserved and prunes them by default
(`load_runtime(..., prune=False)` runs them).

:class:`PersonaPlexServerModel` is what the runtime binds: the two instances over ONE copy of the weights,
each a :class:`PersonaPlexCadenceModel`, the reproduction's own decoder (its arithmetic untouched) plus
small, value-identical adjustments that make its state bindable:

* `carries`: the decoder's carry objects under their module paths (`carries.decoder.model.3.block.1`
  is the `ConvCarry` of `decoder.model.3.block.1`), since the decoder keys them by dotted names;
* every conv's one-time left padding (`padding_to_add`) is 0: the runtime hands a zero `previous`
  from the first tick, and `cat([zeros, x])` is the same values as old moshi's `F.pad(x)` with no
  carry (tested `torch.equal`). A host-side flag would also differ between sessions of one model;
* the kernel-1 convs' and the StreamingAdds' carries are always zero-length (they carry nothing;
  stock keeps them as views that pin a copy of their whole input): the SEANet stage keeps them
  `None`, so old moshi takes its no-carry branch (same values, no copy) and checks after each
  firing that they are still empty.

The stages call the instance's methods (`module "mimi.codes_to_latent"`): the transformer stage calls
the decoder transformer directly (the reproduction's `CUDAGraphed` is bypassed: the runtime captures its
own graphs); the SEANet stage runs under `no_compile()` as stock. `other_mimi` is built when something
first reaches it (a binding or a stage of a plan that keeps it): a pruned plan never does, so its state
objects are never allocated.

Two ways to run both instances' work, for comparison with stock (which runs both, one after the other):
:class:`PersonaPlexCadenceTail` serves the two instances as two sessions of ONE runtime (each session the
clock's `mimi`; with `lanes=2` stepped together by `Runtime.step_many`, their graphs replaying
concurrently on two CUDA streams; with `lockstep=True` the two rows of ONE session at B=2, see
:class:`~duplexcadence.interpreter.runtime.lockstep.LockstepGroup`), and :class:`PersonaPlexServerTail`
with `prune=False` runs the clock as declared, both instances in one session. The instances are always in
lockstep (same tick, same reset), which the old code's one `end_offset` per batch needs. Lockstep rows are
computed by kernels chosen for batch 2, so whether they equal the batch-1 stock instances is a property of
the device's kernels, measured in docs/benchmarks.md; opt-in.
"""

from __future__ import annotations

import functools
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
        for conv in self.decoder.convs.values():
            if conv.initial_padding == 0:  # kernel 1: keeps k - 1 = 0 inputs
                self.empty_carries.append(conv)
            conv.initial_padding = conv.padding_to_add = 0
        self.carries: dict = {}
        for name, carry in (*self.decoder.convs.items(), *self.decoder.conv_transposes.items()):
            _insert(self.carries, name, carry)
        for name, add in self.decoder.adds.items():
            _insert(self.carries, f"{name}.add", add)

    def clear_empty_carries(self) -> None:
        """Set the always-empty carries back to None; raise if one ever held something."""
        for carry in self.empty_carries:
            for field in ("previous",) if isinstance(carry, ConvCarry) else ("previous_x", "previous_y"):
                value = getattr(carry, field)
                if value is not None and value.shape[-1] != 0:
                    raise RuntimeError(f"a carry declared empty holds {tuple(value.shape)}: {carry}")
                setattr(carry, field, None)

    def codes_to_latent(self, codes: torch.Tensor) -> torch.Tensor:
        """Codebook decode and the 2x upsample (its `partial` bound): codes [B, 8, 1] -> latent [B, 2, 512]
        (time-major, the layout of the upsample's own output: see the clock file)."""
        decoder = self.decoder
        latent = decoder.mimi.decode_latent(codes)
        return decoder._conv_transpose("upsample.convtr", decoder.mimi.upsample.convtr, latent).transpose(1, 2)

    def decoder_transformer(self, latent: torch.Tensor) -> torch.Tensor:
        """The decoder transformer (ring KV and offsets bound): latent [B, 2, 512] -> latent [B, 2, 512]; the
        stock code runs it on the [B, 512, 2] view."""
        (latent,) = self.decoder._run_decoder_transformer(latent.transpose(1, 2))
        return latent.transpose(1, 2)

    def seanet_decoder(self, latent: torch.Tensor) -> torch.Tensor:
        """The SEANet decoder, eager ops as stock (conv carries and convtr partials bound): latent [B, 2, 512]
        (run on its [B, 512, 2] view, as stock) -> PCM [B, 1, 1920]."""
        self.clear_empty_carries()
        with no_compile():
            pcm = self.decoder._run_seanet_decoder(latent.transpose(1, 2))
        self.clear_empty_carries()
        return pcm


class PersonaPlexServerModel:
    """The model the clock binds: PersonaPlex's server's two Mimi instances over one copy of the weights.

    `mimi` and `other_mimi` are :class:`PersonaPlexCadenceModel`s over the same moshi 0.2.13 `MimiModel`
    (upstream loads the checkpoint twice; the weights are equal, so one copy serves both). `other_mimi` is
    built when first reached: a plan that prunes it never allocates its state objects.
    """

    def __init__(self, mimi, batch_size: int = 1) -> None:
        self.weights = mimi
        self.batch_size = batch_size
        self.mimi = PersonaPlexCadenceModel(mimi, batch_size)

    @functools.cached_property
    def other_mimi(self) -> PersonaPlexCadenceModel:
        return PersonaPlexCadenceModel(self.weights, self.batch_size)

    def audio_tokens(self, codes: torch.Tensor) -> torch.Tensor:
        """The tokens both instances decode (the server's `tokens[:, 1:9]`, here the 8 codebooks as given)."""
        return codes


def load_runtime(
    mimi,
    batch_size: int = 1,
    device: str | torch.device | None = None,
    sessions: int = 1,
    graphs: bool | str = "auto",
    max_graphs: int | None = None,
    lanes: int = 1,
    prune: bool = True,
) -> Runtime:
    """A runtime for PersonaPlex's decode tail over `mimi`'s weights: each step decodes one frame as the
    server does, with both instances, of which the plan keeps only `mimi`'s unless `prune=False`.

    Each session has its own state (KV rings, carries and offsets). `mimi` is a moshi 0.2.13 `MimiModel`
    (see `duplexcadence.examples.moshi.model.build_mimi`); it is not put in streaming mode.
    """
    from duplexcadence.examples.moshi.model import materialize_codebook_tables

    device = device or next(mimi.parameters()).device
    materialize_codebook_tables(mimi)  # eagerly, so no capture ever creates a codebook table
    return Runtime.load(
        clock_path(),
        PersonaPlexServerModel(mimi, batch_size),
        params={"B": batch_size},
        device=device,
        sessions=sessions,
        graphs=graphs,
        max_graphs=max_graphs,
        lanes=lanes,
        prune=prune,
    )


class PersonaPlexServerTail:
    """PersonaPlex's tail as its server runs it: one session decodes each tick through the clock's two
    instances. With `prune` (the default) the plan leaves out `other_mimi`'s work, which no output sees:
    `step(codes)` returns (main PCM, None). With `prune=False` both instances run, `mimi` first as in
    `server.py`, and `step` returns (main PCM, None) too: `other_mimi`'s PCM is scratch that nothing reads
    (its state is in the session's regions, `other_kv[0]`...)."""

    def __init__(
        self,
        mimi,
        batch_size: int = 1,
        device: str | torch.device | None = None,
        graphs: bool | str = "auto",
        max_graphs: int | None = None,
        prune: bool = True,
    ) -> None:
        self.runtime = load_runtime(mimi, batch_size, device=device, graphs=graphs, max_graphs=max_graphs, prune=prune)
        self.session = self.runtime.session()

    def step(self, codes: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.session.step(codes=codes), None

    def reset(self) -> None:
        self.session.reset()

    def close(self) -> None:
        self.session.close()


class PersonaPlexCadenceTail:
    """PersonaPlex's two instances as two sessions of one runtime over one Mimi: both PCMs every tick.

    Each session is the clock's `mimi` (its `other_mimi` pruned); the second session does `other_mimi`'s
    work (same weights, same codes, its own state). `step(codes)` decodes one tick with both, main PCM
    first as `server.py` does, and returns (main PCM, other PCM), like :meth:`~.stock.PersonaPlexTail.step`.
    With `lanes=2` the instances are in two lanes and are stepped together by `Runtime.step_many`
    (concurrently, on two CUDA streams). With `lockstep=True` they are the two rows of one B=2 session,
    decoded by one replay (batch 1 only; not with lanes).
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
            assert isinstance(self.main, Member) and isinstance(self.other, Member)  # the group's two rows
            rows = self.group.step({self.main: codes, self.other: codes})
            return rows[self.main], rows[self.other]
        assert isinstance(self.main, Session) and isinstance(self.other, Session)  # not lockstep: two sessions
        if self.lanes > 1:
            outputs = self.runtime.step_many({self.main: {"codes": codes}, self.other: {"codes": codes}})
            return outputs[self.main], outputs[self.other]
        return self.main.step(codes=codes), self.other.step(codes=codes)

    def reset(self) -> None:
        """A new conversation: both instances back to their start (the server's reset_streaming)."""
        if self.group is not None:
            self.group.reset()
            return
        assert isinstance(self.main, Session) and isinstance(self.other, Session)  # not lockstep: two sessions
        self.main.reset()
        self.other.reset()

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            return
        assert isinstance(self.main, Session) and isinstance(self.other, Session)  # not lockstep: two sessions
        self.main.close()
        self.other.close()
