"""A small GPT-style transformer and its LightningModule, sharded by whichever strategy runs it.

Token + position embeddings, ``n_layers`` pre-LN blocks (causal self-attention, MLP), a final
LayerNorm and an LM head whose weight is tied to the token embedding. ``configure_model``
wraps each block and then the whole network: with ``fsdp_ncclx`` (FSDP1, inside Lightning's
``enable_wrap`` context) and with ``fsdp2_ncclx`` (``fully_shard`` on the data-parallel mesh);
with DDP it does nothing. ``activation_checkpointing=true`` recomputes each block in the backward
(non-reentrant ``torch.utils.checkpoint``: works on GPU and CPU, with DDP, FSDP and FSDP2).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.checkpoint import checkpoint


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"model.d_model={d_model} is not a multiple of model.n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, activation_checkpointing: bool = False) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)
        self.activation_checkpointing = activation_checkpointing

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class GPT(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, d_model: int, n_layers: int, n_heads: int,
                 dropout: float = 0.0, activation_checkpointing: bool = False) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, dropout, activation_checkpointing) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2: scale residual projections by depth
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class GPTLightningModule(LightningModule):
    """Next-token prediction with AdamW; the sharding is applied in ``configure_model``."""

    def __init__(self, vocab_size: int = 128, seq_len: int = 32, d_model: int = 32, n_layers: int = 2,
                 n_heads: int = 4, dropout: float = 0.0, lr: float = 3e-3, weight_decay: float = 0.1,
                 activation_checkpointing: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(vocab_size, seq_len, d_model, n_layers, n_heads, dropout, activation_checkpointing)
        self._sharded = False

    def configure_model(self) -> None:
        if self._sharded:
            return
        self._sharded = True
        from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

        strategy = self.trainer.strategy
        if isinstance(strategy, ModelParallelStrategy):
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for block in self.model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(self.model, mesh=mesh)  # embeddings, tied head, final norm
        elif isinstance(strategy, FSDPStrategy):
            from torch.distributed.fsdp.wrap import wrap

            for i, block in enumerate(self.model.blocks):
                self.model.blocks[i] = wrap(block)
            self.model = wrap(self.model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        self.log("train/loss", loss, prog_bar=True, sync_dist=False)
        return loss

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        decay = [p for n, p in self.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in self.named_parameters() if p.ndim < 2]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr,
        )
