"""What a request trace is: `Request`s in arrival order and the tokens a hash id stands for.

Prefix identity comes from `hash_ids`: one id per `block_tokens`-token block of the input
(the last block may be partial), chained so that equal ids mean equal prefixes up to and
including that block (the Mooncake convention). The readers (`ctxlab.sim.trace`) and the
generator (`ctxlab.sim.synthetic`) both build these.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ctxlab.errors import CtxlabError

DEFAULT_BLOCK_TOKENS = 512  # Mooncake's hash block size


@dataclass(slots=True)
class Request:
    """One request of a trace; `arrival` is in seconds from the trace start."""

    index: int
    arrival: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]
    line: int = 0


@dataclass
class Trace:
    """Requests sorted by arrival plus the token count each hash id stands for."""

    name: str
    requests: list[Request]
    block_tokens: int = DEFAULT_BLOCK_TOKENS

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def input_tokens(self) -> int:
        return sum(r.input_len for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def offered_rate(self) -> float | None:
        """Requests per second between the first and the last arrival; None when they all
        arrive at once (or there is one request), where no rate is offered."""
        if len(self.requests) < 2:
            return None
        span = self.requests[-1].arrival - self.requests[0].arrival
        return (len(self.requests) - 1) / span if span > 0 else None

    def time_scaled(self, factor: float) -> Trace:
        """The same requests with every arrival time multiplied by `factor` (0.5: offered
        twice as fast), as `ctxlab bench serve --trace-time-scale` replays a trace."""
        if factor == 1:
            return self
        moved = [replace(r, arrival=r.arrival * factor) for r in self.requests]
        return Trace(self.name, moved, self.block_tokens)


def check_block_tokens(block_tokens: int) -> None:
    """The hash block divides every input length: a whole number of tokens, at least 1."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise CtxlabError(f"the hash block size must be at least 1 token, got {block_tokens}.")
