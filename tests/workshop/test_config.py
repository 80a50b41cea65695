"""The experiment contract: the default is valid, and every mistake is one sentence naming the
key and the file (no model needed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.workshop.config_file import load_config
from ctxlab.workshop.default_config import DEFAULT_TOML
from ctxlab.workshop.demo_eviction import eviction_pool_tokens
from ctxlab.workshop.registry import BY_KEY, REGISTERED


def test_default_and_quick_are_valid() -> None:
    cfg, quick = load_config(), load_config(quick=True)
    assert cfg.prefix_miss.prompt_tokens > quick.prefix_miss.prompt_tokens
    assert set(cfg.predictions) == {d.key for d in REGISTERED}
    assert "compaction.facts_lost" in cfg.required_metrics
    assert quick.useful_context.enabled is False
    assert eviction_pool_tokens(cfg) % cfg.engine.page_size == 0


def test_full_adds_samples_and_excludes_quick() -> None:
    cfg, full = load_config(), load_config(full=True)
    assert full.retrieval_depth.answer_questions == full.retrieval_depth.questions
    assert cfg.retrieval_depth.answer_questions < full.retrieval_depth.answer_questions
    assert cfg.long_vs_retrieval.answer_questions < full.long_vs_retrieval.answer_questions
    assert cfg.followup.documents < 30 <= full.followup.documents  # 30 question-1 pairs
    same = {
        "retrieval_depth": cfg.retrieval_depth,
        "long_vs_retrieval": cfg.long_vs_retrieval,
        "followup": cfg.followup,
    }
    assert full.model_copy(update=same) == cfg  # only those
    with pytest.raises(CtxlabError, match="choose one"):
        load_config(quick=True, full=True)


def test_the_defaults_full_sizes_are_checked_when_asked(tmp_path: Path) -> None:
    # a smaller corpus of the user's is a valid config; only --full asks for 100 answers
    path = tmp_path / "small.toml"
    path.write_text("[retrieval_depth]\nquestions = 20\nanswer_questions = 4\n")
    assert load_config(path).retrieval_depth.questions == 20
    assert load_config(path, quick=True).retrieval_depth.answer_questions == 4
    with pytest.raises(CtxlabError, match=r"full\.retrieval_depth.*more than the 20"):
        load_config(path, full=True)


def test_every_default_prediction_names_a_catalogued_metric() -> None:
    for key, metrics in load_config().predictions.items():
        assert set(metrics) <= set(BY_KEY[key].metric_names)


def test_a_user_file_merges_over_the_default(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        "[engine]\npage_size = 32\n"
        "[predictions.warm_prefix]\nttft_ms = { direction = 'down', range = [0, 5000] }\n"
    )
    cfg = load_config(path)
    assert cfg.engine.page_size == 32
    assert cfg.engine.kv_pool_tokens == load_config().engine.kv_pool_tokens  # kept
    # a [predictions.<demo>] table replaces that demo's default table
    assert set(cfg.predictions["warm_prefix"]) == {"ttft_ms"}
    assert cfg.predictions["warm_prefix"]["ttft_ms"].range == [0, 5000]
    assert "tpot_ms" in load_config().predictions["warm_prefix"]


def test_print_config_is_the_default_contract() -> None:
    assert tomllib.loads(DEFAULT_TOML)["model"]["source"] == "smollm2-135m"


BAD = [
    # (file text, words the sentence must contain)
    ("[engine]\npage_sise = 16\n", ["engine.page_sise", "unknown key"]),
    ("colour = 'red'\n", ["colour", "unknown key"]),
    ("[engine]\npage_size = '16'\n", ["engine.page_size", "integer"]),
    ("[engine]\npage_size = 0\n", ["engine.page_size", "greater than or equal to 1"]),
    ("[engine]\nkv_pool_tokens = 8\n", ["kv_pool_tokens", "less than one page"]),
    ("[model]\ndtype = 'float16'\n", ["model.dtype", "float32"]),
    ("[model]\nreserved_output_tokens = 5000\n", ["reserved_output_tokens", "no prompt budget"]),
    ("[model]\nthreads = -1\n", ["model.threads"]),
    ("[page_size]\npage_sizes = [64, 16]\n", ["page_size", "increasing order"]),
    ("[page_size]\npage_sizes = [16, 'a']\n", ["page_size.page_sizes[1]", "integer"]),
    ("[page_size]\ndivergence_at = 5000\n", ["divergence_at", "inside the pair"]),
    ("[page_size]\ndivergence_at = 1024\n", ["divergence_at", "multiple of every page size"]),
    ("[eviction]\npool_share = 1.5\n", ["eviction.pool_share", "less than 1"]),
    ("[eviction]\npool_share = 0.2\n", ["pool_share", "running requests"]),
    ("[eviction]\nprefix_tokens = 500\n", ["eviction.prefix_tokens", "whole number"]),
    ("[warm_prefix]\nrepeats = 1\n", ["warm_prefix.repeats"]),
    ("[warm_prefix]\nprefix_tokens = 9000\n", ["warm_prefix", "max_model_len"]),
    ("[retrieval_depth]\nretriever = 'grep'\n", ["retrieval_depth.retriever", "bm25"]),
    ("[compaction]\nstrategies = []\n", ["compaction.strategies"]),
    ("[recurrent_vs_kv]\nrecurrent_arch = 'llama-3.1-8b'\n", ["recurrent_arch", "no recurrent"]),
    ("[recurrent_vs_kv]\nkv_arch = 'gpt-5'\n", ["kv_arch", "not a preset"]),
    ("[recurrent_vs_kv]\nkv_arch = 'absent/config.json'\n", ["kv_arch", "absent/config.json"]),
    ("[model]\narch = 'gpt-5'\n", ["model.arch", "not a preset"]),
    ("[recurrent_vs_kv]\ndevice = 'tpu'\n", ["device", "not a device"]),
    ("[recurrent_vs_kv]\nshort = { requests = 0 }\n", ["recurrent_vs_kv.short.requests"]),
    ("[recurrent_vs_kv]\nengine_long = { input_tokens = 9000 }\n", ["engine_long", "does not fit"]),
    ("[useful_context]\ntasks = ['sudoku']\n", ["useful_context.tasks", "not an eval task"]),
    ("[predictions.warm_prefix]\nttft = { direction = 'down' }\n", ["warm_prefix", "'ttft'"]),
    ("[predictions.nonsense]\nx = { direction = 'down' }\n", ["'nonsense'", "demonstration"]),
    ("[predictions.warm_prefix]\nttft_ms = { direction = 'sideways' }\n", ["direction", "'up'"]),
    ("[predictions.warm_prefix]\nttft_ms = { direction = 'up', tolerance = -1 }\n", ["tolerance"]),
    (
        "[predictions.warm_prefix]\nttft_ms = { direction = 'up', range = [3, 1] }\n",
        ["range", "low <= high"],
    ),
    ("required_metrics = ['warm_prefix.nope']\n", ["required_metrics", "'nope'"]),
    ("required_metrics = ['ttft_ms']\n", ["required_metrics", "demonstration.metric"]),
    ("[quick.engine]\npage_size = -1\n", ["quick.engine.page_size"]),
    ("[full.retrieval_depth]\nanswer_questions = 0\n", ["full.retrieval_depth.answer_questions"]),
    ("full = 3\n", ["[full] must be a table"]),
    ("[engine\n", ["not valid TOML"]),
]


@pytest.mark.parametrize(("text", "words"), BAD, ids=[b[0].split("\n")[0][:40] for b in BAD])
def test_each_mistake_is_one_sentence_naming_key_and_file(
    tmp_path: Path, text: str, words: list[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(CtxlabError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg, msg
    for word in words:
        assert word in msg, (word, msg)
    assert "\n" not in msg and msg.endswith("."), msg
    assert "Traceback" not in msg and "pydantic" not in msg.lower(), msg


def test_a_missing_file_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(CtxlabError, match="does not exist"):
        load_config(tmp_path / "absent.toml")


def test_docs_list_every_metric() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "workshop.md").read_text()
    for demo in REGISTERED:
        for name in demo.metric_names:
            assert f"`{name}`" in text, name


def _numbers(doc: dict, path: tuple[str, ...] = ()):
    """(key path, value) of every number in the default contract (lists: their first item),
    predictions and size tables left out (their bounds are the predicted metric's)."""
    for key, value in doc.items():
        if isinstance(value, dict):
            if not path and key in ("predictions", "quick", "full"):
                continue
            yield from _numbers(value, (*path, key))
        elif isinstance(value, list) and value and isinstance(value[0], int | float):
            yield (*path, key), value[0]
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield (*path, key), value


ABSURD = sorted(_numbers(tomllib.loads(DEFAULT_TOML)))


@pytest.mark.parametrize(("path", "value"), ABSURD, ids=[".".join(p) for p, _ in ABSURD])
def test_every_number_of_the_contract_refuses_an_absurd_value(tmp_path: Path, path, value):
    """10^12 of anything (repeats, documents, tokens, a seed past 2**64) and 1e300 of any
    price, rate or second is one sentence naming the key, before anything loads: a run of
    10^12 repeats never ends and 1e300 seconds overflow a sleep."""
    big = "1e300" if isinstance(value, float) else str(10**12 if "seed" not in path[-1] else 2**70)
    table, key = ".".join(path[:-1]), path[-1]
    shown = f"[{big}]" if _is_list(path) else big
    text = (f"[{table}]\n" if table else "") + f"{key} = {shown}\n"
    if len(path) > 2:  # an inline table (recurrent_vs_kv.short): write it whole
        default = _lookup(path[:-1])
        inner = ", ".join(f"{k} = {big if k == key else repr(v)}" for k, v in default.items())
        text = f"[{path[0]}]\n{path[1]} = {{ {inner} }}\n"
    cfg_path = tmp_path / "absurd.toml"
    cfg_path.write_text(text, encoding="utf-8")
    with pytest.raises(CtxlabError) as err:
        load_config(cfg_path)
    message = str(err.value)
    assert message.startswith(str(cfg_path)) and key in message, message
    assert "\n" not in message


def _lookup(path: tuple[str, ...]):
    doc = tomllib.loads(DEFAULT_TOML)
    for part in path:
        doc = doc[part]
    return doc


def _is_list(path: tuple[str, ...]) -> bool:
    return isinstance(_lookup(path), list)
