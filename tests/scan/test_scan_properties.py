"""Property test: any chain of receiver, views, indexing and cast is classified by one rule."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fp8mla.scan import scan_source

POOLS = [
    "kv_cache",
    "self.k_buffer",
    "pool.get_key_buffer(layer.layer_id)",
    "forward_batch.token_to_kv_pool.get_value_buffer(0)",
    "self.kv_buffer[layer_id - self.start_layer]",
]
ACTIVATIONS = ["q", "hidden_states", "self.weight", "attn_output[loc]", "cache_k"]
VIEWS = [".view(-1, 576)", ".contiguous()", ".transpose(0, 1)", ".flatten()", ".split(512, -1)[0]"]
BASIC = ["", "[:, :, :512]", "[..., 512:]", "[0]", "[:, :, : layer.v_head_dim]"]
GATHERS = ["[loc]", "[:, kv_indices]", ".index_select(0, loc)", ".gather(0, idx)", "[mask]"]
CASTS = [
    ".to(q.dtype)",
    ".float()",
    ".half()",
    ".bfloat16()",
    ".type(torch.float16)",
    ".to(dtype=torch.bfloat16)",
    ".to(q)",
    ".to(q.device, torch.float32)",
]
NOT_CASTS = [".to('cuda')", ".view(torch.uint8)", ".to(q.device)", ".to(device=dev)", ".clone()"]


@settings(max_examples=300, deadline=None)
@given(
    receiver=st.sampled_from(POOLS + ACTIVATIONS),
    before=st.lists(st.sampled_from(VIEWS), max_size=2),
    index=st.sampled_from(BASIC + GATHERS),
    after=st.lists(st.sampled_from(VIEWS), max_size=2),
    call=st.sampled_from(CASTS + NOT_CASTS),
    alias=st.booleans(),
)
def test_classification(
    receiver: str, before: list[str], index: str, after: list[str], call: str, alias: bool
) -> None:
    operand = receiver + "".join(before) + index + "".join(after)
    if alias:
        body = f"    x = {operand}\n    return x{call}\n"
    else:
        body = f"    return {operand}{call}\n"
    findings = scan_source(f"def forward(self, q, layer, forward_batch, pool):\n{body}")
    if receiver in ACTIVATIONS or call in NOT_CASTS:
        assert findings == []
    else:
        expected = "gathered_cast" if index in GATHERS else "whole_pool_cast"
        assert [(f.kind, f.function, f.line) for f in findings] == [
            (expected, "forward", 3 if alias else 2)
        ]
