"""`ctxlab watch`: subscribes, fills a late start from the replay socket, writes
residency.json and residency.png, explains requests; mistakes are one sentence."""

from __future__ import annotations

import json
import threading
import time

import pytest

from ctxlab.kvevents.publisher import EventPublisher, block_id
from tests.cli.conftest import run_in_process
from tests.kvevents.test_events import free_port

BS = 4


@pytest.fixture
def cli(monkeypatch, capsys):
    return lambda *args: run_in_process(monkeypatch, capsys, *args)


def _h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_watch_writes_residency_and_explains(cli, tmp_path):
    ep, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    pub = EventPublisher(ep, rep)
    prompt = list(range(100, 100 + 2 * BS + 1))
    t_before = time.time()
    pub.stored([_h(1), _h(2)], None, prompt[: 2 * BS], BS, None)  # before watch: replayed
    time.sleep(0.2)
    t_stored = time.time()
    stop = threading.Event()

    def later() -> None:  # live batches while watch runs: block 2 evicted, then noise
        time.sleep(0.6)
        pub.removed([_h(2)])
        i = 10
        while not stop.wait(0.1):
            pub.stored([_h(i)], None, [i] * BS, BS, "other")
            i += 1

    reqs = tmp_path / "requests.jsonl"
    rows = [
        {"at": t_before - 1, "token_ids": prompt},
        {"at": t_stored, "token_ids": prompt},
        {"at": t_stored, "token_ids": [1, 2]},
        {"at": t_stored + 2.0, "token_ids": [10] * BS + [0], "salt": "mine"},
    ]
    reqs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    thread = threading.Thread(target=later)
    thread.start()
    try:
        res = cli(
            "watch", ep, "--seconds", "2.5", "--replay", rep, "--out", str(tmp_path / "o"),
            "--requests", str(reqs), "--json",
        )  # fmt: skip
    finally:
        stop.set()
        thread.join()
        pub.close()
    assert res.code == 0, res.err
    doc = json.loads((tmp_path / "o" / "residency.json").read_text())
    assert json.loads(res.out) == doc
    assert (tmp_path / "o" / "residency.png").stat().st_size > 1000
    assert doc["gaps"] == []  # the batch sent before the watch came from the replay socket
    assert doc["summary"]["block_size"] == BS and doc["summary"]["evictions"] == 1
    assert doc["evictions"][0]["block"] == f"{block_id(_h(2)):016x}"
    assert [r["reason"] for r in doc["requests"]] == [
        "never stored",
        "hit",
        "shorter than one block",
        "another salt",
    ]
    assert doc["requests"][1]["hit_blocks"] == 2


def test_watch_with_no_publisher_says_so(cli, tmp_path):
    res = cli("watch", f"tcp://127.0.0.1:{free_port()}", "--seconds", "0.3", "--out", str(tmp_path))
    assert res.code != 0 and "no KV events arrived" in res.err
    assert "Traceback" not in res.err and len(res.err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["tcp://192.168.1.2:5557"], "loopback"),
        (["tcp://127.0.0.1:5557", "--seconds", "-1"], "--seconds"),
        (["tcp://127.0.0.1:5557", "--requests", "/nonexistent.jsonl"], "--requests"),
    ],
)
def test_watch_mistakes_are_one_sentence(cli, tmp_path, args, says):
    res = cli("watch", *args, "--out", str(tmp_path))
    assert res.code == 2 and says in res.err and "Traceback" not in res.err


def test_watch_bad_request_line(cli, tmp_path):
    reqs = tmp_path / "r.jsonl"
    reqs.write_text('{"at": 1, "token_ids": [1, -2]}\n')
    res = cli("watch", "tcp://127.0.0.1:5557", "--requests", str(reqs), "--out", str(tmp_path))
    assert res.code == 2 and "r.jsonl:1" in res.err and "token_ids" in res.err


def test_watch_after_the_fact_reads_the_replay_buffer(cli, tmp_path):
    ep, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    pub = EventPublisher(ep, rep)
    try:
        for i in range(3):  # nobody listens yet
            pub.stored([_h(i)], None, [i] * BS, BS, None)
            time.sleep(0.1)
        pub.removed([_h(0)])
        time.sleep(0.2)
        out = str(tmp_path)
        res = cli("watch", ep, "--replay", rep, "--seconds", "0.5", "--out", out, "--json")
    finally:
        pub.close()
    assert res.code == 0, res.err
    doc = json.loads(res.out)
    assert doc["batches"] == pub.published_batches >= 2 and doc["gaps"] == []
    assert doc["summary"]["stored_blocks"] == 3 and doc["summary"]["evictions"] == 1
