"""Tenants: an API key names a tenant, and a tenant's name salts its prefix-cache hashes.

The engine mixes a request's `cache_salt` into the hash of its first block (and so, through
the chain, of every block), so two requests with different salts never share a cached
block, even with the same prompt. Without a key file the salt is the request's own
`cache_salt` field (vLLM's behaviour). With one, every `/v1` request needs a key from the
file, and the salt always starts with the key's tenant: a request's own `cache_salt`
narrows sharing inside its tenant and can never reach another tenant's blocks.

Key file (TOML):

    [keys]
    "sk-alice-1" = "alice"
    "sk-alice-2" = "alice"   # two keys of one tenant share its cache
    "sk-bob" = "bob"
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from pathlib import Path

from ctxlab.errors import CtxlabError
from ctxlab.inputs import load_toml
from ctxlab.serve.errors import APIError


@dataclass(frozen=True)
class Tenants:
    keys: dict[str, str]  # API key -> tenant name

    @classmethod
    def load(cls, path: Path) -> Tenants:
        """Read and check a key file; a bad one is one sentence naming what is wrong."""
        doc = load_toml(path, "--api-keys")
        keys = doc.get("keys")
        extra = sorted(set(doc) - {"keys"})
        if extra:
            raise CtxlabError(f"--api-keys {path}: unknown table or key {extra[0]!r}; use [keys].")
        if not isinstance(keys, dict) or not keys:
            raise CtxlabError(f'--api-keys {path} needs a [keys] table: "API key" = "tenant".')
        for key, tenant in keys.items():
            if not isinstance(tenant, str) or not tenant.strip():
                raise CtxlabError(
                    f"--api-keys {path}: the tenant of key {key[:4]!r}... must be a non-empty "
                    f"string, got {tenant!r}."
                )
            if len(key) < 8:
                raise CtxlabError(
                    f"--api-keys {path}: key {key[:4]!r}... is shorter than 8 characters."
                )
        return cls(dict(keys))

    def tenant_of(self, authorization: str | None) -> str:
        """The tenant of a request's `Authorization: Bearer KEY` header, or a 401."""
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise APIError(
                401, "this server needs an API key: send Authorization: Bearer KEY.",
                code="invalid_api_key",
            )  # fmt: skip
        found = None
        for known, tenant in self.keys.items():  # compare every key in constant time
            if hmac.compare_digest(known.encode(), key.encode()):
                found = tenant
        if found is None:
            raise APIError(401, "the API key is not valid for this server.", code="invalid_api_key")
        return found


def cache_salt(tenant: str | None, request_salt: str | None) -> str | None:
    """The salt the engine hashes: the request's own, or (tenant, request salt) unambiguously."""
    if tenant is None:
        return request_salt
    return json.dumps(["tenant", tenant, request_salt])
