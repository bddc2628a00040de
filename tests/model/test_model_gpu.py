"""GPU properties of the model: the forward makes no host syncs and replays from a CUDA graph,
and bf16 on the GPU tracks the float32 CPU model (dummy weights are identical on both)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from granikv.model import RefAttention, load_model, load_spec

pytestmark = pytest.mark.gpu


class StaticCacheAttention:
    """Decode attention over a fixed per-request history plus the current token: static
    shapes and no host syncs, like the engine's backends inside a graph."""

    def __init__(self, num_layers: int, batch: int, history: int, hkv: int, d: int, dtype):
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.k = torch.randn(num_layers, batch, history, hkv, d, device="cuda", dtype=dtype, generator=gen)
        self.v = torch.randn(num_layers, batch, history, hkv, d, device="cuda", dtype=dtype, generator=gen)

    def __call__(self, layer_id, q, k, v):
        b, hq, d = q.shape
        g = hq // k.shape[1]

        def expand(cache, new):  # [B, S, Hkv, d] + [B, Hkv, d] -> [B, Hq, S+1, d], GQA by expand
            x = torch.cat([cache, new[:, None]], dim=1).transpose(1, 2)
            return x[:, :, None].expand(b, x.shape[1], g, x.shape[2], d).reshape(b, hq, x.shape[2], d)

        kk, vv = expand(self.k[layer_id], k), expand(self.v[layer_id], v)
        o = F.scaled_dot_product_attention(q[:, :, None], kk, vv)
        return o[:, :, 0]


def test_decode_forward_is_sync_free_and_graph_capturable():
    spec = load_spec("tiny")
    model = load_model(spec, dtype=torch.bfloat16, device="cuda", max_positions=512)
    batch = 8
    attn = StaticCacheAttention(spec.num_layers, batch, 16, spec.num_kv_heads, spec.head_dim, torch.bfloat16)
    ids = torch.randint(0, spec.vocab_size, (batch,), device="cuda")
    pos = torch.randint(16, 500, (batch,), device="cuda")

    model(ids, pos, attn)  # warm-up (library handles, workspaces) outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(ids, pos, attn)
    finally:
        torch.cuda.set_sync_debug_mode(0)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model(ids, pos, attn)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(ids, pos, attn)

    new_ids = torch.randint(0, spec.vocab_size, (batch,), device="cuda")
    new_pos = torch.randint(16, 500, (batch,), device="cuda")
    ids.copy_(new_ids)
    pos.copy_(new_pos)
    graph.replay()
    torch.cuda.synchronize()
    expected = model(new_ids, new_pos, attn)
    torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen"])
def test_bf16_gpu_tracks_fp32_cpu(name):
    spec = load_spec(name)
    lengths = (9, 30)
    ids = torch.randint(0, spec.vocab_size, (sum(lengths),), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(n) for n in lengths])
    outs = []
    for device, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
        model = load_model(spec, seed=4, dtype=dtype, device=device, max_positions=64)
        attn = RefAttention(spec.num_layers)
        attn.set_batch([(i, n) for i, n in enumerate(lengths)])
        outs.append(model(ids.to(device), pos.to(device), attn).cpu())
    ref, got = outs
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 5e-2
