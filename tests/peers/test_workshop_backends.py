"""`workshop --server`'s two seams to a server (token-id completions through `ServerLLM`,
chats through `ServerChatBackend`) read every answer through the same checks as the other
commands: a hostile answer is one sentence, a hang ends at the request deadline. (The CLI
run loads a model first; these drive the seams directly.)"""

from __future__ import annotations

import time

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.peer.fields import BadAnswer
from ctxlab.probe.client import ServerGone
from tests.peers.hostile import Script, good_events, good_reply, hostile

VOCAB = 49152


def _server(url: str):
    from ctxlab.workshop.server_backend import ServerLLM

    return ServerLLM.connect(url, None, None, None, VOCAB)  # token ids need no tokenizer


def _chat(server):
    from ctxlab.workshop.server_chat import ServerChatBackend

    return ServerChatBackend(server, None, 2048, 64)


def _cached_above(body):
    out = good_events(body)
    out[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] = 10**6
    return out


def _usage_list(body):
    doc = good_reply(body)
    doc["usage"] = [3]
    return doc


def test_completions_refuse_impossible_cached_tokens():
    with hostile(Script(events=_cached_above)) as (url, _):
        server = _server(url)
        try:
            with pytest.raises(BadAnswer, match="more cached tokens than prompt tokens"):
                server.generate([[1200, 1300, 1400]])
        finally:
            server.close()


def test_chats_refuse_a_usage_that_is_a_list():
    with hostile(Script(reply=_usage_list)) as (url, _):
        server = _server(url)
        chat = _chat(server)
        try:
            with pytest.raises(BadAnswer, match="usage"):
                chat.generate([[{"role": "user", "content": "hi"}]], 2)
        finally:
            chat.close()
            server.close()


@pytest.mark.parametrize("hang", ["silent", "trickle", "keepalive"])
def test_a_hang_ends_at_the_request_deadline(hang):
    # connecting POSTs /tokenize once; the first completion is answered too
    with hostile(Script(hang=hang, hang_after=2)) as (url, _):
        server = _server(url)
        server.client.timeout = 1.0
        chat = _chat(server)
        try:
            server.generate([[1200, 1300]])  # answered: the server is known to work
            start = time.monotonic()
            with pytest.raises(ServerGone, match="within 1 s"):
                server.generate([[1200, 1300]])
            with pytest.raises((ServerGone, CtxlabError), match="within 1 s"):
                chat.generate([[{"role": "user", "content": "hi"}]], 2)
            assert time.monotonic() - start < 15.0
        finally:
            chat.close()
            server.close()
