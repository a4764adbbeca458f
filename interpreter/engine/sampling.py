"""Batched sampling on the device: R rows, each a conversation with its own settings and random stream.

    sampler = Sampler(SamplingConfig(vocab=151748, window=512, penalty="distinct", banned=2), slots=16, device="cuda")
    sampler.open(slot, seed, temperature=0.7, top_k=20, top_p=0.8, penalty=1.05, banned=[(pad, NEVER), ...])
    tokens = sampler.sample(rows, logits)      # logits [R, vocab] of slots `rows` (device int64 [R])
    sampler.record(rows, chosen)               # what the rows went on with (the tokens, or a forced choice)

Every slot keeps, on the device at a stable address: its random stream (a key from its seed and a draw
counter), its settings (temperature, top-k, top-p, repetition penalty), a window of the last `window` tokens it
recorded and the tokens it bans. `sample` and `record` read no host value and advance the counters and windows
on the device, so a graph captured at R rows replays for any slots; `open`, `restart` and `ban` are eager.

What `sample` does to a row's logits, in float32 (the order upstream's samplers use; each step commutes with
the ones before it):

1. the repetition penalty over the tokens in the row's window: `distinct` (MiniCPM-o's
   `StreamDecoder.decode`): the logit of each distinct token divided by the penalty; `repeat`
   (`CustomRepetitionPenaltyLogitsProcessorRepeat`): with n occurrences, a positive logit divided by
   penalty^n, a negative one multiplied by it;
2. banned tokens to -inf while the row has recorded fewer tokens than the ban's count (end of speech before a
   minimum length; `NEVER`: always);
3. divided by the temperature; top-k (the k most likely tokens; 0: off), then top-p (in order of
   likelihood, a token is cut once the mass of the tokens before it exceeds top_p);
4. one token drawn by inverse transform from the row's next uniform.

The uniform of draw c of a slot is a function of (its key, c) only (`uniforms`: Wellons' lowbias32 integer
hash, github.com/skeeto/hash-prospector, chained over the key and the counter), so a row's tokens do not depend
on which rows share its batch, and a conversation replays the same from the same seed. The counter has 2^32
draws before the stream repeats.

`candidates`: where every row's top-k is at most K, top-k and top-p work on `torch.topk`'s K best logits
instead of a sort of the whole vocabulary (the same tokens, far less work).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

PENALTIES = ("distinct", "repeat")
NEVER = 2**62
"""A ban's count that is never reached: the token is always banned."""
_MASK32 = 0xFFFFFFFF


def _multiply32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2^32 for x < 2^32 in int64, without overflow: the constant in 16-bit halves."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _multiply32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _multiply32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_key(seed: int) -> int:
    """The key of a random stream seeded with `seed` (any integer; its low 64 bits count)."""
    seed &= 2**64 - 1
    low, high = torch.tensor(seed & _MASK32), torch.tensor(seed >> 32)
    return int(_lowbias32(_lowbias32(low) ^ high))


def uniforms(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Float32 uniforms in [0, 1), 24 bits each, of draws `counters` of streams `keys` (int64 tensors of one
    shape)."""
    bits = _lowbias32(keys ^ _lowbias32(counters & _MASK32))
    return (bits >> 8).to(torch.float32) * 2.0**-24


@attrs.frozen
class SamplingConfig:
    """What every slot of a sampler shares: the vocabulary, the penalty's window and kind, how many bans a
    slot holds, and `candidates` (None: top-k and top-p over a sort of the whole vocabulary)."""

    vocab: int
    window: int = 1
    penalty: str = "distinct"
    banned: int = 0
    candidates: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty must be one of {', '.join(PENALTIES)}, got {self.penalty!r}")
        for name in ("vocab", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"SamplingConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.banned < 0:
            raise ValueError(f"SamplingConfig.banned must be at least 0, got {self.banned}")
        if self.candidates is not None and not 1 <= self.candidates <= self.vocab:
            raise ValueError(f"SamplingConfig.candidates must be in 1..{self.vocab} or None, got {self.candidates}")


class Sampler:
    """Per-slot sampling state on the device and the batched `sample` / `record` (see the module docstring)."""

    def __init__(self, config: SamplingConfig, slots: int, device: str | torch.device) -> None:
        self.config = config
        self.slots = slots

        def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.keys = zeros(slots)
        self.counters = zeros(slots)
        """Draws made by each slot's stream."""
        self.temperature = torch.ones(slots, device=device)
        self.top_k = zeros(slots)
        self.top_p = torch.ones(slots, device=device)
        self.penalty = torch.ones(slots, device=device)
        self.window = zeros(slots, config.window)
        """The last `config.window` tokens recorded, a ring per slot (entry `recorded % window` is next)."""
        self.recorded = zeros(slots)
        """Tokens recorded since the slot was opened or restarted."""
        self.banned_tokens = zeros(slots, config.banned)
        self.banned_until = zeros(slots, config.banned)
        """Token `banned_tokens[s, i]` is banned while `recorded[s] < banned_until[s, i]`."""
        self._ones = torch.ones(slots, dtype=torch.int64, device=device)

    @property
    def device(self) -> torch.device:
        return self.keys.device

    # -- eager

    def open(
        self,
        slot: int,
        seed: int,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        penalty: float = 1.0,
        banned: Sequence[tuple[int, int]] = (),
    ) -> None:
        """Start `slot` on a new conversation: its stream seeded with `seed`, its window empty, its settings
        (see the module docstring; `banned`: (token, count) pairs, the token banned until `count` tokens are
        recorded)."""
        self._check_slot(slot)
        problems = []
        if not temperature > 0:
            problems.append(f"temperature must be > 0, got {temperature}")
        if not 0 < top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {top_p}")
        if not penalty > 0:
            problems.append(f"penalty must be > 0, got {penalty}")
        limit = self.config.candidates
        if limit is None and not 0 <= top_k <= self.config.vocab:
            problems.append(f"top_k must be in 0..{self.config.vocab} (0: off), got {top_k}")
        if limit is not None and not 1 <= top_k <= limit:
            problems.append(f"top_k must be in 1..{limit} (the sampler's candidates), got {top_k}")
        if problems:
            raise ValueError(f"Sampler.open(slot {slot}): " + "; ".join(problems))
        self.keys[slot] = stream_key(seed)
        self.counters[slot] = 0
        self.temperature[slot] = temperature
        self.top_k[slot] = top_k
        self.top_p[slot] = top_p
        self.penalty[slot] = penalty
        self.ban(slot, banned)
        self.restart(slot)

    def restart(self, slot: int) -> None:
        """Empty `slot`'s window and its count of recorded tokens (a new TTS chunk); its stream goes on."""
        self._check_slot(slot)
        self.recorded[slot] = 0

    def ban(self, slot: int, banned: Sequence[tuple[int, int]]) -> None:
        """`slot`'s bans: (token, count) pairs, at most `config.banned`."""
        self._check_slot(slot)
        if len(banned) > self.config.banned:
            raise ValueError(f"slot {slot}: {len(banned)} bans, the sampler holds {self.config.banned} a slot")
        for token, _ in banned:
            if not 0 <= token < self.config.vocab:
                raise ValueError(
                    f"slot {slot}: banned token {token} is not in the vocabulary 0..{self.config.vocab - 1}"
                )
        self.banned_tokens[slot] = 0
        self.banned_until[slot] = 0  # token 0 until 0: nothing banned
        for index, (token, count) in enumerate(banned):
            self.banned_tokens[slot, index] = token
            self.banned_until[slot, index] = count

    def distribution(self, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The probabilities [R, vocab] `sample` draws each row's token from (float32)."""
        probabilities, order = self._candidates(rows, logits)
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(1, order, probabilities)

    # -- capturable: device rows, no host values

    def sample(self, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """A token [R] (int64) for each row from its processed `logits` [R, vocab]; advances the rows' counters."""
        probabilities, order = self._candidates(rows, logits)
        return order.gather(1, self._draw(rows, probabilities)).squeeze(1)

    def draw(self, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """A token [R] for each row from softmax(`logits`) as given (no penalty, ban, temperature or
        filter: a model's check on its raw distribution); advances the rows' counters."""
        self._check(rows, logits)
        return self._draw(rows, logits.float().softmax(-1)).squeeze(1)

    def record(self, rows: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> None:
        """Append `tokens` [R] to the rows' windows (only where `keep` [R] is true, if given)."""
        self._check(rows)
        count = self.recorded[rows]
        position = (count % self.config.window)[:, None]
        if keep is None:
            self.window[rows[:, None], position] = tokens[:, None]
            self.recorded.index_add_(0, rows, self._ones[: rows.shape[0]])
        else:
            current = self.window[rows[:, None], position]
            self.window[rows[:, None], position] = torch.where(keep[:, None], tokens[:, None], current)
            self.recorded.index_add_(0, rows, keep.to(torch.int64))

    # -- the steps

    def _candidates(self, rows: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities [R, N], token ids [R, N]) of the row's candidates after steps 1-3."""
        self._check(rows, logits)
        scores = self._penalized(rows, logits.float())
        scores = self._banned(rows, scores)
        if self.config.candidates is None:
            values, order = torch.sort(scores, dim=1, descending=True, stable=True)
        else:
            values, order = torch.topk(scores, self.config.candidates, dim=1)
        values = values / self.temperature[rows][:, None]
        ranks = torch.arange(values.shape[1], device=values.device)
        top_k = self.top_k[rows][:, None]
        values = values.masked_fill((top_k > 0) & (ranks >= top_k), float("-inf"))
        mass_before = values.softmax(1).cumsum(1)
        beyond = torch.zeros_like(values, dtype=torch.bool)
        beyond[:, 1:] = mass_before[:, :-1] > self.top_p[rows][:, None]
        return values.masked_fill(beyond, float("-inf")).softmax(1), order

    def _penalized(self, rows: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        recorded = self.recorded[rows]
        seen = torch.arange(self.config.window, device=scores.device) < recorded[:, None]  # [R, window]
        counts = torch.zeros_like(scores).scatter_add_(1, self.window[rows], seen.to(scores.dtype))
        penalty = self.penalty[rows][:, None]
        if self.config.penalty == "distinct":
            return scores / torch.where(counts > 0, penalty, 1.0)
        factor = penalty**counts
        return torch.where(scores < 0, scores * factor, scores / factor)

    def _banned(self, rows: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.config.banned:
            return scores
        active = self.recorded[rows][:, None] < self.banned_until[rows]  # [R, banned]
        return scores.scatter_add(1, self.banned_tokens[rows], torch.where(active, float("-inf"), 0.0))

    def _draw(self, rows: torch.Tensor, probabilities: torch.Tensor) -> torch.Tensor:
        """Index [R, 1] into each row of `probabilities` by inverse transform; advances the rows' counters."""
        u = uniforms(self.keys[rows], self.counters[rows])
        self.counters.index_add_(0, rows, self._ones[: rows.shape[0]])
        cumulative = probabilities.cumsum(1)
        index = torch.searchsorted(cumulative, (u * cumulative[:, -1])[:, None], right=True)
        return index.clamp_(max=probabilities.shape[1] - 1)

    def _check(self, rows: torch.Tensor, logits: torch.Tensor | None = None) -> None:
        if rows.dim() != 1 or rows.dtype != torch.int64 or rows.device != self.device:
            raise ValueError(
                f"rows must be a 1-d int64 tensor of slot indices on {self.device}, "
                f"got {rows.dtype} {list(rows.shape)} on {rows.device}"
            )
        if logits is not None and (logits.shape != (rows.shape[0], self.config.vocab) or logits.device != self.device):
            raise ValueError(
                f"logits must be [rows={rows.shape[0]}, vocab={self.config.vocab}] on {self.device}, "
                f"got {list(logits.shape)} on {logits.device}"
            )

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is not one of this sampler's slots 0..{self.slots - 1}")
