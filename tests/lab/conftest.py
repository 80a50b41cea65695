"""Fixtures of the lab tests: a real lab server on a free loopback port, in a thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ctxlab.lab.server import start_in_thread


@pytest.fixture(scope="module")
def lab_url() -> Iterator[str]:
    server, url = start_in_thread("127.0.0.1", 0)
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
