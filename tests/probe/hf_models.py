"""Tiny random-weight transformers models built from configs (no downloads), as probe factory targets:
`neuron-migrate probe tests/probe/hf_models.py:gpt2`. Each returns (model, keyword inputs with labels)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

VOCAB, SEQ, BATCH = 96, 12, 2


def _ids():
    torch.manual_seed(0)
    return torch.randint(0, VOCAB, (BATCH, SEQ))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=32)
    ids = _ids()
    return GPT2LMHeadModel(cfg), {"input_ids": ids, "labels": ids}


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     vocab_size=VOCAB, max_position_embeddings=32, num_labels=3)
    ids = _ids()
    return BertForSequenceClassification(cfg), {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                                "labels": torch.tensor([0, 2])}


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=32)
    ids = _ids()
    return LlamaForCausalLM(cfg), {"input_ids": ids, "labels": ids}


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, num_labels=3)
    torch.manual_seed(0)
    return ViTForImageClassification(cfg), {"pixel_values": torch.randn(BATCH, 3, 16, 16),
                                            "labels": torch.tensor([1, 2])}


def fnet():
    """FNet mixes tokens with torch.fft (fftn over the sequence and hidden dimensions)."""
    from transformers import FNetConfig, FNetForSequenceClassification

    cfg = FNetConfig(hidden_size=32, num_hidden_layers=2, intermediate_size=64, vocab_size=VOCAB,
                     max_position_embeddings=32, num_labels=3, use_tpu_fourier_optimizations=False)
    ids = _ids()
    return FNetForSequenceClassification(cfg), {"input_ids": ids, "labels": torch.tensor([0, 1])}
