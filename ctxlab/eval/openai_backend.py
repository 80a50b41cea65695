"""Score any OpenAI-compatible server (vLLM, SGLang, ctxlab serve) on the same tasks.

The remote cache is not visible from here, so rows from this backend carry no resident KV
bytes and the report says so. Sizing uses the local default tokenizer, which is only an
approximation of the remote model's count; the row records the local count it used.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.eval.sample import TaskSample


@dataclass(frozen=True)
class Generation:
    text: str
    resident_kv_bytes: int | None
    prompt_tokens: int | None = None


@dataclass
class OpenAIBackend:
    base_url: str
    model: str = "default"
    api_key: str = "none"
    timeout_s: float = 600.0

    name: str = "openai"

    def _post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        url = self.base_url.rstrip("/") + path
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:200]
            raise CtxlabError(f"{url} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise CtxlabError(
                f"cannot reach the OpenAI-compatible server at {url} ({exc})"
            ) from None
        except json.JSONDecodeError:
            raise CtxlabError(f"{url} did not answer with JSON") from None

    def generate(self, samples: list[TaskSample]) -> list[Generation]:
        out = []
        for sample in samples:
            reply = self._post(
                "/v1/chat/completions",
                {
                    "model": self.model,
                    "messages": [
                        {
                            "role": "user",
                            "content": f"{sample.instruction}\n\n{sample.answer_prefix}",
                        }
                    ],
                    "max_tokens": sample.max_new_tokens,
                    "temperature": 0.0,
                },
            )
            try:
                text = reply["choices"][0]["message"]["content"]  # type: ignore[index]
                usage = reply.get("usage") or {}
            except (KeyError, IndexError, TypeError):
                raise CtxlabError(
                    f"{self.base_url} answered without choices[0].message.content"
                ) from None
            out.append(Generation(str(text), None, usage.get("prompt_tokens")))  # type: ignore[union-attr]
        return out
