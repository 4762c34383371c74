"""Policy and critic models, and the per-token log-probs / values the objective needs.

The policy is any Hugging Face causal LM. The critic is the same architecture's
backbone with a scalar value head. Log-probs are computed from the backbone's
hidden states in chunks of positions (each chunk re-run in backward through
activation checkpointing), so a 128k-token trajectory never materialises its
full [T, vocab] logits.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

log = logging.getLogger(__name__)

LOGIT_CHUNK = 4096


def load_policy(path: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.config.use_cache = False
    return model


class Critic(nn.Module):
    """Backbone of the policy's architecture + a linear value head (zero-initialised)."""

    def __init__(self, backbone: nn.Module, hidden: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """values[b, t] = V(state before token t) = head(hidden at t-1); values[:, 0] = 0."""
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        v = self.value_head(h).squeeze(-1)
        return F.pad(v[:, :-1], (1, 0))


def load_critic(path: str, dtype: torch.dtype = torch.float32) -> Critic:
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(path, dtype=dtype)
    backbone.config.use_cache = False
    critic = Critic(backbone, backbone.config.hidden_size)
    return critic.to(dtype)


def _chunk_logp(head: nn.Module, h: torch.Tensor, targets: torch.Tensor, want_entropy: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(h).float()
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    if want_entropy:
        with torch.no_grad():
            p = torch.softmax(logits, dim=-1)
            ent = logz - (p * logits).sum(-1)
    else:
        ent = torch.zeros_like(logp)
    return logp, ent


def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   want_entropy: bool = False, chunk: int = LOGIT_CHUNK, select: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), both [B, T]: position t holds log pi(token t | tokens < t); position 0 is 0.

    ``select`` ([B, T]): only the positions where it is > 0 get theirs, the others hold 0. The objective reads
    the loss-masked positions only, and most positions of an agentic episode are prompt and tool output: the
    vocabulary projection (a small model's largest per-token cost, any model's largest activation) then runs
    on the generated tokens alone."""
    backbone = model.get_decoder()
    head = model.get_output_embeddings()
    h = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    h = h[:, :-1]
    targets = input_ids[:, 1:]
    if select is None:
        logp, ent = _chunked_logp(head, h, targets, want_entropy, chunk)
        return F.pad(logp, (1, 0)), F.pad(ent, (1, 0))
    sel = select[:, 1:] > 0
    if not bool(sel.any()):  # a padding micro-batch: one position keeps the graph (and the ranks' backward) alive
        sel = sel.clone()
        sel[0, 0] = True
    lp_rows, ent_rows = _chunked_logp(head, h[sel].unsqueeze(0), targets[sel].unsqueeze(0), want_entropy,
                                      chunk * h.shape[0])
    zeros = torch.zeros(targets.shape, dtype=lp_rows.dtype, device=h.device)
    logp = zeros.masked_scatter(sel, lp_rows[0])
    ent = zeros.masked_scatter(sel, ent_rows[0])
    return F.pad(logp, (1, 0)), F.pad(ent, (1, 0))


def _chunked_logp(head: nn.Module, h: torch.Tensor, targets: torch.Tensor, want_entropy: bool, chunk: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """_chunk_logp over chunks of ``chunk`` positions (dim 1), each re-run in backward (checkpointed)."""
    T = h.shape[1]
    parts_lp, parts_ent = [], []
    for s in range(0, T, chunk):
        hs, ts = h[:, s:s + chunk], targets[:, s:s + chunk]
        if torch.is_grad_enabled() and T > chunk:
            lp, ent = checkpoint(_chunk_logp, head, hs, ts, want_entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_logp(head, hs, ts, want_entropy)
        parts_lp.append(lp)
        parts_ent.append(ent)
    return torch.cat(parts_lp, dim=1), torch.cat(parts_ent, dim=1)
