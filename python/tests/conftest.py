import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
torch.set_num_threads(1)


@pytest.fixture
def tiny_config() -> dict:
    """A very small Llama config (a few thousand parameters) for fast tests."""
    cfg = json.loads((ROOT / "templates" / "tiny-demo" / "model" / "config.json").read_text())
    cfg.update(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32
    )
    return cfg
