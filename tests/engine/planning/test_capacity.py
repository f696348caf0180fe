"""Capacity options: 8-bit KV and a disk tier reach further than RAM alone, with predicted decode costs."""

from engine.planning.capacity import capacity_options
from engine.planning.shape import ModelShape
from engine.planning.policy import OffloadPolicy
from transformers import LlamaConfig

GIB = 1 << 30


def test_each_option_reaches_further_and_says_what_decode_costs(tmp_path):
    shape = ModelShape.from_config(LlamaConfig(num_hidden_layers=32, num_key_value_heads=8, head_dim=128,
                                               num_attention_heads=32, hidden_size=4096), dtype_bytes=2)
    ram, eight, disk = capacity_options(shape, OffloadPolicy(), device_is_cuda=True, gpu_budget=24 * GIB,
                                        host_budget=32 * GIB, disk_dir=str(tmp_path), disk_gbps=2.0)
    assert ram.name == "RAM" and ram.disk_bytes == 0 and ram.host_bytes <= 32 * GIB
    assert 1.8 < eight.max_context / ram.max_context < 2.1  # 1 byte + a scale per head instead of 2 bytes
    assert disk.max_context > eight.max_context and disk.disk_bytes > 0
    assert ram.decode_seconds < disk.decode_seconds  # disk bytes cross a slower path
    no_folder = capacity_options(shape, OffloadPolicy(), device_is_cuda=True, gpu_budget=24 * GIB,
                                 host_budget=32 * GIB)
    assert [o.name for o in no_folder] == ["RAM", "RAM + 8-bit (lossy)"]
