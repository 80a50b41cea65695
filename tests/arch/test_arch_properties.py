"""Property tests of the cache arithmetic: monotonic in length, sliding layers capped, TP views."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.arch import PRESETS, ArchSpec, LayerSpec, RecurrentState, get_preset

preset_names = st.sampled_from(sorted(PRESETS))
lengths = st.integers(min_value=0, max_value=2_000_000)

full_layers = st.builds(
    lambda h, dk, dv: LayerSpec("full", kv_heads=h, d_k=dk, d_v=dv),
    st.integers(1, 64),
    st.integers(1, 256),
    st.integers(1, 256),
)
sliding_layers = st.builds(
    lambda h, d, w: LayerSpec("sliding", kv_heads=h, d_k=d, d_v=d, window=w),
    st.integers(1, 64),
    st.integers(1, 256),
    st.integers(1, 100_000),
)
mla_layers = st.builds(
    lambda c, r: LayerSpec("mla", kv_heads=8, d_k=192, d_v=128, d_c=c, d_rope=r),
    st.integers(1, 2048),
    st.integers(0, 128),
)
recurrent_layers = st.builds(
    lambda h, d: LayerSpec("recurrent", recurrent=RecurrentState("kda", heads=h, head_dim=d)),
    st.integers(1, 64),
    st.integers(1, 256),
)
any_layer = st.one_of(full_layers, sliding_layers, mla_layers, recurrent_layers)
dtypes = st.sampled_from([0.5, 1, 2, 4])


@st.composite
def archs(draw) -> ArchSpec:
    layers = tuple(draw(st.lists(any_layer, min_size=1, max_size=12)))
    return ArchSpec(
        name="random",
        layers=layers,
        n_query_heads=64,
        hidden_size=4096,
        params=1,
        cache_dtype_bytes=draw(dtypes),
    )


@settings(max_examples=200, deadline=None)
@given(archs(), lengths, lengths)
def test_request_bytes_monotonic_in_length(arch: ArchSpec, a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert arch.request_bytes(lo) <= arch.request_bytes(hi)


@settings(max_examples=100, deadline=None)
@given(preset_names, lengths, lengths)
def test_presets_monotonic_in_length(name: str, a: int, b: int) -> None:
    arch = get_preset(name)
    lo, hi = sorted((a, b))
    assert arch.request_bytes(lo) <= arch.request_bytes(hi)
    assert arch.request_bytes(lo) >= arch.fixed_state_bytes()


@settings(max_examples=200, deadline=None)
@given(sliding_layers, lengths, dtypes)
def test_sliding_layer_bounded_by_its_window(layer: LayerSpec, n: int, dtype: float) -> None:
    assert layer.window is not None
    cap = layer.request_bytes(layer.window, dtype)
    assert layer.request_bytes(n, dtype) <= cap
    if n >= layer.window:
        assert layer.request_bytes(n, dtype) == cap
    else:
        assert layer.resident_tokens(n) == n
        assert layer.request_bytes(n, dtype) <= layer.request_bytes(n + 1, dtype)


@settings(max_examples=100, deadline=None)
@given(preset_names, st.integers(0, 2_000_000))
def test_sliding_share_of_a_preset_never_exceeds_its_windows(name: str, n: int) -> None:
    arch = get_preset(name)
    by_kind = arch.request_bytes_by_kind(n)
    for layer in arch.layers:
        if layer.kind == "sliding":
            bound = arch.layers.count(layer) * layer.request_bytes(
                layer.window or 0, arch.cache_dtype_bytes
            )
            assert by_kind[layer.label()] <= bound


@settings(max_examples=200, deadline=None)
@given(archs(), st.integers(1, 2_000_000))
def test_full_length_bytes_equal_per_token_times_length_without_windows(
    arch: ArchSpec, n: int
) -> None:
    if any(layer.kind == "sliding" for layer in arch.layers) or arch.cache_dtype_bytes < 1:
        return
    assert arch.request_bytes(n) == arch.kv_bytes_per_token() * n + arch.fixed_state_bytes()


@settings(max_examples=200, deadline=None)
@given(archs(), st.integers(1, 64), st.integers(0, 100_000))
def test_tensor_parallel_rank_holds_at_least_its_share(arch: ArchSpec, tp: int, n: int) -> None:
    per_rank = arch.request_bytes_per_rank(n, tp)
    assert per_rank <= arch.request_bytes(n)
    assert per_rank * tp >= arch.request_bytes(n)
