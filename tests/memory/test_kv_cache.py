import pytest
import torch

from granikv.memory import KVCache


def test_shapes_and_reserved_slot():
    kv = KVCache(num_layers=3, num_slots=10, num_kv_heads=2, head_dim=4)
    assert len(kv.k) == len(kv.v) == 3
    assert kv.k[0].shape == (10, 2, 4) and kv.k[0].dtype == torch.float32
    assert kv.slot_bytes == 2 * 3 * 2 * 4 * 4
    assert kv.total_bytes == kv.slot_bytes * 10


def test_bytes_per_slot_llama8b_bf16():
    # 2 (K,V) * 32 layers * 8 heads * 128 dims * 2 bytes = 128 KiB (docs/design.md, "Numbers to design against")
    assert KVCache.bytes_per_slot(32, 8, 128, torch.bfloat16) == 128 * 1024


def test_slots_for_budget():
    per = KVCache.bytes_per_slot(2, 2, 8, torch.float16)
    assert KVCache.slots_for_budget(per * 100 + per - 1, 2, 2, 8, torch.float16) == 100
    with pytest.raises(ValueError):
        KVCache.slots_for_budget(per, 2, 2, 8, torch.float16)


def test_copy_slots_moves_every_layer():
    kv = KVCache(num_layers=2, num_slots=8, num_kv_heads=1, head_dim=2)
    for layer in range(2):
        kv.k[layer][3] = layer + 1
        kv.v[layer][4] = -(layer + 1)
    kv.copy_slots(torch.tensor([3, 4]), torch.tensor([6, 7]))
    for layer in range(2):
        assert torch.all(kv.k[layer][6] == layer + 1)
        assert torch.all(kv.v[layer][7] == -(layer + 1))


def test_too_small():
    with pytest.raises(ValueError):
        KVCache(num_layers=1, num_slots=1, num_kv_heads=1, head_dim=1)
