"""Our decoder reproduces Hugging Face transformers' logits (float32) on the tiny shapes.

The HF model is built with random weights, saved as a sharded safetensors checkpoint and
loaded back through our loader (so the loader's fusing is tested too). Several sequences of
different lengths are prefilled in one flat batch, then decoded for 32 steps one token each,
against HF's own KV cache (past_key_values). Sequences run past the tiny spec's original
RoPE context (64), so every band of the Llama-3 frequency scaling matters.
"""

from __future__ import annotations

import pytest
import torch

from granikv.model import CausalLM, RefAttention, SafetensorsSource, load_spec, load_weights

LENGTHS = (5, 37, 90)
DECODE_STEPS = 32
TOL = 1e-4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")
@pytest.mark.parametrize("name", ["tiny", "tiny-qwen"])
def test_prefill_and_decode_match_transformers(name, hf_checkpoint):
    spec = load_spec(name)
    hf, path = hf_checkpoint(spec)
    ours_spec = load_spec(path)  # the spec read back from the saved config.json
    assert (ours_spec.rope_scaling, ours_spec.qkv_bias, ours_spec.tie_word_embeddings) == (
        spec.rope_scaling, spec.qkv_bias, spec.tie_word_embeddings)
    model = CausalLM(ours_spec, max_positions=256)
    load_weights(model, SafetensorsSource(path))

    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, spec.vocab_size, (n,), generator=gen) for n in LENGTHS]
    attn = RefAttention(spec.num_layers)

    # Prefill: all sequences in one flat batch, logits of every row.
    attn.set_batch([(i, n) for i, n in enumerate(LENGTHS)])
    ids = torch.cat(prompts)
    pos = torch.cat([torch.arange(n) for n in LENGTHS])
    logits = model(ids, pos, attn)
    assert logits.shape == (sum(LENGTHS), spec.vocab_size) and logits.dtype == torch.float32

    caches, next_tok, off = [], [], 0
    with torch.no_grad():
        for p in prompts:
            out = hf(p[None], use_cache=True)
            ref = out.logits[0].float()
            assert rel_err(logits[off : off + len(p)], ref) < TOL
            caches.append(out.past_key_values)
            next_tok.append(int(ref[-1].argmax()))
            off += len(p)

    # Decode: one token per sequence per step, greedy on HF's logits (both models get the same
    # tokens, so a near-tie can not make them diverge), only the rows asked for.
    lengths = list(LENGTHS)
    for _ in range(DECODE_STEPS):
        attn.set_batch([(i, 1) for i in range(len(prompts))])
        ids = torch.tensor(next_tok)
        pos = torch.tensor(lengths)
        logits = model(ids, pos, attn, logits_index=torch.arange(len(prompts)))
        with torch.no_grad():
            for i in range(len(prompts)):
                out = hf(ids[i].view(1, 1), past_key_values=caches[i], use_cache=True)
                ref = out.logits[0, -1].float()
                assert rel_err(logits[i], ref) < TOL
                # our greedy pick is HF's, up to a tie within the tolerance
                assert ref.max() - ref[logits[i].argmax()] <= 2 * TOL * ref.abs().max()
                caches[i] = out.past_key_values
                next_tok[i] = int(ref.argmax())
        lengths = [n + 1 for n in lengths]
    assert attn.seq_len(2) == LENGTHS[2] + DECODE_STEPS


def test_logits_index_selects_rows(hf_checkpoint):
    """logits_index returns exactly the chosen rows of the full logits (e.g. last tokens)."""
    spec = load_spec("tiny")
    _, path = hf_checkpoint(spec, sharded=False)  # single model.safetensors, no index file
    model = CausalLM(load_spec(path), max_positions=128)
    load_weights(model, SafetensorsSource(path))
    ids = torch.randint(0, spec.vocab_size, (12,))
    pos = torch.cat([torch.arange(5), torch.arange(7)])

    def run(index):
        attn = RefAttention(spec.num_layers)
        attn.set_batch([("a", 5), ("b", 7)])
        return model(ids, pos, attn, logits_index=index)

    full = run(None)
    last = run(torch.tensor([4, 11]))
    torch.testing.assert_close(last, full[[4, 11]], rtol=0, atol=1e-6)
    assert not last.is_inference()  # callers may post-process logits in place
