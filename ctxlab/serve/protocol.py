"""The OpenAI request bodies `ctxlab serve` accepts, checked field by field (pydantic).

Unknown fields are refused (a typo must not be silently ignored), and so are known OpenAI
fields this server does not implement when they ask for something (`n` > 1, penalties,
logprobs, tools): one sentence naming the field, HTTP 400. vLLM's extensions that matter
here are accepted: `cache_salt` (tenant isolation of the prefix cache), `ignore_eos`,
`top_k` and `repetition_penalty` at its neutral 1.0 (sent by `vllm bench serve`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from ctxlab.engine.sampling import SamplingParams
from ctxlab.inputs import SEED_MAX

PositiveInt = Annotated[int, Field(ge=1)]


class StreamOptions(BaseModel):
    """`include_usage`: one chunk with the usage before [DONE] (OpenAI). vLLM's
    `continuous_usage_stats`, with `include_usage` (alone it adds nothing, as in vLLM):
    every chunk also carries the running usage of its prompt (`responses.Reply`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False


# Temperatures below this sample greedily, as vLLM's `_SAMPLING_EPS`: dividing logits by a
# denormal temperature gives inf, and sampling from inf/nan probabilities fails (an HTTP 500).
SAMPLING_EPS = 1e-5


class _Common(BaseModel):
    """Fields both endpoints share: sampling, streaming, the tenant salt."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = 0
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    user: str | None = None
    n: Literal[1] = 1
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    repetition_penalty: Literal[1, 1.0] = 1.0
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and (len(v) > 4 or not all(v)):
            raise ValueError("stop takes up to 4 non-empty strings")
        if isinstance(v, str) and not v:
            raise ValueError("a stop string must not be empty")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported by this server")
        return v

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Common:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk: vLLM's rule (`should_include_usage`), both options set."""
        return self.include_usage and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )

    def sampling(self, max_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if self.temperature < SAMPLING_EPS else self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            seed=self.seed,
            stop=stop,
            ignore_eos=self.ignore_eos,
        )


TokenIds = list[int]
PromptField = str | TokenIds | list[str] | list[TokenIds]


def _is_id(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _prompt_shape(v: object) -> object:
    """Read the prompt by its shape before pydantic tries the union's members, so `[5, -1]`
    is "token id -1 is out of range", not the str member's "Input should be a valid string".
    Token ids above the vocabulary are the engine's to refuse (it knows the vocabulary)."""
    if isinstance(v, str):
        return v
    shape = "the prompt must be text, a list of token ids, or a list of either"
    if not isinstance(v, list):
        raise ValueError(shape)
    if all(isinstance(p, str) for p in v):
        return v
    batch = v if v and isinstance(v[0], list) else [v]
    for b, ids in enumerate(batch):
        if not isinstance(ids, list) or not all(_is_id(t) for t in ids):
            raise ValueError(shape)
        where = f"prompt[{b}]" if batch is v else "prompt"
        bad = next((i for i, t in enumerate(ids) if t < 0), None)
        if bad is not None:
            raise ValueError(
                f"token id {ids[bad]} at {where}[{bad}] is out of range (ids are 0 or more)"
            )
    return v


class CompletionRequest(_Common):
    """`POST /v1/completions`: one prompt (text or token ids) or a batch of them."""

    prompt: Annotated[PromptField, BeforeValidator(_prompt_shape)]
    echo: Literal[False] = False
    logprobs: None = None
    best_of: Literal[1] | None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, str):
            if not v:
                raise ValueError("the prompt is empty")
        elif not v:
            raise ValueError("the prompt list is empty")
        elif isinstance(v[0], str | list) and not all(v):
            raise ValueError("a prompt in the batch is empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The batch: one prompt per choice, in order."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        """What the model's chat template reads (a developer message is a system message)."""
        text = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_Common):
    """`POST /v1/chat/completions`: messages rendered with the model's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: PositiveInt | None = None
    logprobs: Literal[False] = False
    top_logprobs: None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        if not v:
            raise ValueError("messages is empty; give at least one message")
        return v

    @field_validator("response_format")
    @classmethod
    def _format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "text") != "text":
            raise ValueError("only response_format {'type': 'text'} is supported")
        return v

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
