"""A vLLM worker extension: weight reload that also restores tied embeddings.

vLLM's in-place ``reload_weights`` reloads each layer from the checkpoint. A
checkpoint with tied embeddings (Qwen2 small models, the tiny test model) has no
``lm_head.weight``: the reload leaves the LM head on the *old* weights (and, on
CPU, on its old pre-packed GEMM handle) while the input embedding gets the new
ones. ``krl_reload`` re-ties the head to the new embedding and re-runs its
post-load processing, so every weight really is the new version's. Loaded into
the engine's worker by ``worker_extension_cls``; called through collective_rpc.
"""
from __future__ import annotations


def retie_lm_head(model) -> bool:
    """Point a tied LM head at the (new) input embedding again; True if it did."""
    cfg = getattr(model, "config", None)
    if not getattr(cfg, "tie_word_embeddings", False):
        return False
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if head is None or embed is None or head is embed or not hasattr(head, "weight"):
        return False
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)  # CPU: rebuild the packed GEMM from the new weight
    return True


class KrlWorkerExtension:
    def krl_reload(self, weights_path: str) -> dict:
        self.reload_weights(weights_path=weights_path)
        retied = retie_lm_head(self.model_runner.get_model())
        return {"retied": retied}
