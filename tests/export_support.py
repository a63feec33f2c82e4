"""Tiny Hugging Face (and PEFT) models trained a few steps through the Strategy API, saved as
treadle checkpoints: what the export tests start from (tests/ is on sys.path)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import treadle
from support import make_tokens


class TokenBatches(Dataset):
    """make_tokens' pairs as a causal LM takes them: ``input_ids`` and ``labels``."""

    def __init__(self, n: int = 16, seed: int = 0) -> None:
        self.pairs = make_tokens(n, seed=seed)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.pairs[i]
        ids = torch.cat([x, y[-1:]])
        return {"input_ids": ids, "labels": ids}


def llama(tied: bool = True, seed: int = 0) -> nn.Module:
    """A 2-layer Llama (no download); its embeddings tied to the head by default."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                         tie_word_embeddings=tied)
    return LlamaForCausalLM(config)


def train_and_save(model: nn.Module, path: Path, *, iters: int = 3, save_frozen: bool = False) -> nn.Module:
    """Train ``model`` ``iters`` AdamW steps in one process and save a checkpoint at ``path``
    (its frozen weights left out unless ``save_frozen``); returns the trained module."""
    strategy = treadle.build_strategy("single", work_dir=path.parent, seed=0)
    prepared, ow = strategy.prepare(model, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-2)))
    loader = strategy.prepare_dataloader(DataLoader(TokenBatches(), batch_size=4))
    for i, batch in enumerate(loader):
        if i == iters:
            break
        ow.update_params(prepared(**batch).loss)
    strategy.save_checkpoint(path, save_frozen=save_frozen)
    return model


def logits(model: nn.Module, seed: int = 3) -> torch.Tensor:
    """The model's logits on a fixed batch, in eval mode."""
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(seed))
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits
