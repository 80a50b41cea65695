"""Request bodies a hostile or unusual client sends the lab: a number with thousands of
digits (Python refuses to convert it: a 500 before), and a chunked body with no
Content-Length (its fields were ignored and the defaults planned). Each is either read as
meant or refused with a 400 naming why."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit

import pytest

FORM = {"arch": "preset", "preset": "llama-3.1-8b", "context": "8192", "concurrency": "3"}


def _post(lab_url: str, body: bytes, chunks: int | None = None) -> tuple[int, dict[str, Any]]:
    url = urlsplit(lab_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if chunks is None:
        conn.request("POST", "/api/plan", body=body, headers=headers)
    else:
        step = max(1, len(body) // chunks)
        parts = [body[i : i + step] for i in range(0, len(body), step)]
        conn.request("POST", "/api/plan", body=iter(parts), headers=headers, encode_chunked=True)
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    conn.close()
    return resp.status, doc


def test_a_number_of_thousands_of_digits_is_a_400_naming_it(lab_url):
    raw = b'{"arch": "preset", "preset": "llama-3.1-8b", "context": ' + b"9" * 5000 + b"}"
    status, doc = _post(lab_url, raw)
    assert status == 400, doc
    assert "more than 4,300 digits" in doc["error"]


def test_a_chunked_body_is_read_not_replaced_by_the_defaults(lab_url):
    body = json.dumps(FORM).encode()
    whole_status, whole = _post(lab_url, body)
    default_status, default = _post(lab_url, b"{}")
    assert whole_status == default_status == 200
    assert whole != default  # the form asks for something else than the defaults
    for chunks in (1, 3, len(body)):
        status, chunked = _post(lab_url, body, chunks=chunks)
        assert status == 200, chunked
        assert chunked == whole


def test_a_chunked_body_that_lies_about_its_size_is_a_400(lab_url):
    url = urlsplit(lab_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("POST", "/api/plan")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"zz\r\n{}\r\n0\r\n\r\n")
    resp = conn.getresponse()
    assert resp.status == 400
    assert "malformed" in json.loads(resp.read())["error"]
    conn.close()


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"[1, 2]", "must be a JSON object"),
        (b'"plan me"', "must be a JSON object"),
        (b'{"arch": "preset", "preset": "llama-3.1-8b", "context": 1e400}', "not a finite number"),
        (b'{"arch": "preset", "preset": "llama-3.1-8b", "context": NaN}', "not a finite number"),
        (b'{"arch": "preset", "preset": "llama-3.1-8b", "context": 8192, '
         b'"concurrency": 1000000000000000}', "absurdly large"),
        (b'{"arch": "\xff\xfe"}', "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "too large"),
    ],
)  # fmt: skip
def test_other_hostile_bodies_are_a_400_naming_why(lab_url, raw, said):
    """The issue 33 re-walk's variants: a body that is not an object, a non-finite or absurd
    number, bytes that are not UTF-8, nesting past any form."""
    status, doc = _post(lab_url, raw)
    assert status == 400, doc
    assert said in doc["error"], doc
