"""Property tests of the planner's arithmetic over random layer mixes and lengths."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.arch import LayerSpec, RecurrentState
from ctxlab.arch.spec import ArchSpec
from ctxlab.plan.compute import prefill
from ctxlab.plan.devices import get_device
from ctxlab.plan.paging import allocated_slots, paged_request, wasted_slots
from ctxlab.plan.sharing import prefix_sharing

H100 = get_device("h100")

heads = st.integers(1, 8)
dims = st.sampled_from([16, 64, 128])
full = st.builds(lambda h, d: LayerSpec("full", kv_heads=h, d_k=d, d_v=d), heads, dims)
sliding = st.builds(
    lambda h, d, w: LayerSpec("sliding", kv_heads=h, d_k=d, d_v=d, window=w),
    heads,
    dims,
    st.integers(1, 4096),
)
mla = st.builds(lambda c, r: LayerSpec("mla", d_c=c, d_rope=r), st.integers(1, 512), dims)
recurrent = st.builds(
    lambda h, d: LayerSpec("recurrent", recurrent=RecurrentState("kda", heads=h, head_dim=d)),
    heads,
    dims,
)
any_layer = st.one_of(full, sliding, mla, recurrent)
archs = st.builds(
    lambda layers, dtype: ArchSpec(
        "random",
        tuple(layers),
        n_query_heads=8,
        hidden_size=64,
        params=10**6,
        cache_dtype_bytes=dtype,
    ),
    st.lists(any_layer, min_size=1, max_size=6),
    st.sampled_from([0.5, 1, 2]),
)
lengths = st.integers(1, 200_000)
pages = st.integers(1, 256)


@settings(max_examples=150, deadline=None)
@given(archs, lengths, lengths, pages)
def test_bytes_and_flops_monotonic_in_length(arch, a, b, page):
    short, long = sorted((a, b))
    assert arch.request_bytes(short) <= arch.request_bytes(long)
    # What a request holds at its length can dip as a sliding window leaves a page; the peak
    # it reaches on the way, which capacity reserves, cannot.
    short_paged, long_paged = paged_request(arch, short, page), paged_request(arch, long, page)
    assert short_paged.peak_allocated_bytes <= long_paged.peak_allocated_bytes
    assert long_paged.allocated_bytes <= long_paged.peak_allocated_bytes
    assert prefill(arch, short, H100).flops <= prefill(arch, long, H100).flops


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**7), pages)
def test_page_waste_below_one_page(tokens, page):
    slots = allocated_slots(tokens, page)
    assert slots % page == 0
    assert slots >= tokens
    assert 0 <= wasted_slots(tokens, page) < page


@settings(max_examples=150, deadline=None)
@given(sliding, lengths, pages)
def test_sliding_layer_bounded_by_window(layer, context, page):
    arch = ArchSpec("s", (layer,), n_query_heads=8, hidden_size=64, params=1)
    per_token = layer.bytes_per_token(2)
    assert arch.request_bytes(context) <= per_token * layer.window
    assert arch.request_bytes(context) == per_token * min(context, layer.window)
    # Paged: at most one page more than the window, rounded up.
    bound = (-(-layer.window // page) + 1) * page
    assert paged_request(arch, context, page).allocated_bytes <= per_token * bound


@settings(max_examples=150, deadline=None)
@given(archs, lengths, st.integers(1, 16), st.integers(0, 200_000), pages)
def test_sharing_never_exceeds_the_copies(arch, context, n, prefix, page):
    shared = prefix_sharing(arch, context, n, prefix, page)
    assert 0 <= shared.bytes_avoided_full_pages <= shared.bytes_avoided
    assert shared.bytes_avoided <= (n - 1) * arch.request_bytes(context)
    assert shared.bytes_with_sharing >= arch.request_bytes(context)
