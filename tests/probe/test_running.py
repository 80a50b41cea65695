"""The running-requests gauge, as vLLM, SGLang, llama.cpp and `ctxlab serve` publish it."""

from __future__ import annotations

import pytest

from ctxlab.probe.metrics import parse
from ctxlab.probe.running import running_now

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2-135m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="smollm2-135m"} 5.0
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (VLLM, 3.0),  # the waiting ones are not running
        ("sglang:num_running_reqs 7\nsglang:num_queue_reqs 1\n", 7.0),
        ("llamacpp:requests_processing 2\nllamacpp:requests_deferred 4\n", 2.0),
        (  # summed over series
            'ctxlab:num_requests_running{model_name="a"} 1\n'
            'ctxlab:num_requests_running{model_name="b"} 2\n',
            3.0,
        ),
        ("vllm:num_requests_waiting 5\n", None),  # no running gauge
        ("vllm:num_requests_running NaN\n", None),  # not a count
        ("vllm:num_requests_running -1\n", None),
    ],
)
def test_running_now_reads_each_servers_gauge(text: str, expected: float | None) -> None:
    assert running_now(parse(text)) == expected
