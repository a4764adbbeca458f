"""Trace the carried state of a stock session chunk by chunk (shapes, dtypes, layout, aliasing).

``python -m duplexcadence.examples.minicpmo45.stock_state --prompt-frames 150 --n-timesteps 10``
prints one markdown table per turn: for every ``stream`` call, the shape / dtype / contiguity of
every tensor in ``Token2wav.stream_cache`` and ``Token2wav.hift_cache_dict`` after the call, and
which module buffer it shares storage with. Turn 1: three silence tokens + regular chunks, a
forced-flush chunk, a 3-token last chunk. Turn 2 (after ``reset``): one regular chunk and a
27-token last chunk (the largest chunk MiniCPM-o's buffer logic can produce).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from duplexcadence.examples.minicpmo45.model import RELEASED, TailConfig, Token2wavTail, build_tail, random_prompt
from duplexcadence.examples.minicpmo45.stock import StockToken2wavSession


@dataclass(frozen=True)
class TensorState:
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    contiguous: bool
    aliases: str


@dataclass(frozen=True)
class ChunkState:
    turn: int
    turn_chunk_index: int
    tokens: int
    last_chunk: bool
    samples: int
    seconds: float
    tensors: tuple[TensorState, ...]


def _module_buffers(tail: Token2wavTail) -> dict[str, torch.Tensor]:
    decoder = tail.flow.decoder
    return {
        "flow.decoder.att_cache_buffer": decoder.att_cache_buffer,
        "flow.decoder.cnn_cache_buffer": decoder.cnn_cache_buffer,
        "flow.decoder.estimator.att_cache_buffer": decoder.estimator.att_cache_buffer,
        "flow.decoder.estimator.cnn_cache_buffer": decoder.estimator.cnn_cache_buffer,
    }


def _describe(session: StockToken2wavSession) -> tuple[TensorState, ...]:
    buffers = _module_buffers(session.tail)
    states = []
    for prefix, cache in (("stream_cache", session.stream_cache), ("hift_cache_dict", session.hift_cache)):
        for key, tensor in cache.items():
            pointer = tensor.untyped_storage().data_ptr()
            aliases = [name for name, buffer in buffers.items() if buffer.untyped_storage().data_ptr() == pointer]
            states.append(
                TensorState(
                    f"{prefix}['{key}']",
                    tuple(tensor.shape),
                    tensor.dtype,
                    tensor.is_contiguous(),
                    ", ".join(aliases) or "-",
                )
            )
    return tuple(states)


def trace_session(session: StockToken2wavSession, token_seed: int = 99) -> list[ChunkState]:
    """Run the two-turn script of the module docstring and record the state after every chunk."""
    generator = torch.Generator().manual_seed(token_seed)
    tokens = torch.randint(0, 6561, (400,), generator=generator).tolist()
    records: list[ChunkState] = []

    def run(turn: int, new_tokens: list[int], flush: bool = False, end_of_turn: bool = False) -> None:
        start = time.perf_counter()
        before = len(session.history)
        session.push_tokens(new_tokens, flush=flush, end_of_turn=end_of_turn)
        seconds = (time.perf_counter() - start) / max(1, len(session.history) - before)
        for record in session.history[before:]:
            records.append(
                ChunkState(
                    turn,
                    record.turn_chunk_index,
                    len(record.tokens),
                    record.last_chunk,
                    record.samples,
                    seconds,
                    _describe(session),
                )
            )

    session.reset()
    for index in range(4):
        run(1, tokens[25 * index : 25 * index + 25])
    run(1, tokens[100:110], flush=True)
    run(1, [], end_of_turn=True)
    session.reset()
    run(2, tokens[200:225])
    run(2, tokens[225:249], end_of_turn=True)
    return records


def render_markdown(records: list[ChunkState]) -> str:
    lines = []
    for record in records:
        kind = "last" if record.last_chunk else f"{record.tokens} tokens"
        lines.append(
            f"\n**turn {record.turn}, chunk {record.turn_chunk_index} ({kind}): {record.samples} samples, "
            f"{record.seconds:.2f} s on this machine**\n"
        )
        lines.append("| tensor | shape | dtype | contiguous | shares storage with |")
        lines.append("| --- | --- | --- | --- | --- |")
        for tensor in record.tensors:
            dtype = str(tensor.dtype).removeprefix("torch.")
            lines.append(
                f"| `{tensor.key}` | {list(tensor.shape)} | {dtype} | {tensor.contiguous} | {tensor.aliases} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-frames", type=int, default=150)
    parser.add_argument("--n-timesteps", type=int, default=10)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--dit-depth", type=int, default=RELEASED.dit_depth, help="fewer layers: same state shapes, faster"
    )
    args = parser.parse_args(argv)
    config = TailConfig(dit_depth=args.dit_depth)
    tail = build_tail(config, device=args.device)
    start = time.perf_counter()
    session = StockToken2wavSession(
        tail, random_prompt(args.prompt_frames, device=args.device), n_timesteps=args.n_timesteps
    )
    print(f"P = {args.prompt_frames}, n_timesteps = {args.n_timesteps}, device {args.device}, {config}")
    print(f"setup_cache + clones: {time.perf_counter() - start:.1f} s")
    print("\n**base caches (after setup_cache, cloned)**\n")
    print("| tensor | shape | dtype |")
    print("| --- | --- | --- |")
    for prefix, cache in (("flow", session.base_flow_cache), ("hift", session.base_hift_cache)):
        for key, tensor in cache.items():
            print(f"| {prefix} `{key}` | {list(tensor.shape)} | {str(tensor.dtype).removeprefix('torch.')} |")
    print(render_markdown(trace_session(session)))


if __name__ == "__main__":
    main()
