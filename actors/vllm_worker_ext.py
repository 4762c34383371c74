"""A vLLM worker extension: weight reload (from disk or from staged in-memory buckets) that also re-ties embeddings.

vLLM's in-place ``reload_weights`` reloads each layer from the checkpoint. A
checkpoint with tied embeddings (Qwen2 small models, the tiny test model) has no
``lm_head.weight``: the reload leaves the LM head on the *old* weights (and, on
CPU, on its old pre-packed GEMM handle) while the input embedding gets the new
ones. ``krl_reload`` re-ties the head to the new embedding and re-runs its
post-load processing, so every weight really is the new version's. Loaded into
the engine's worker by ``worker_extension_cls``; called through collective_rpc.

In-memory versions (cluster.weights.buckets): ``krl_stage`` takes one verified bucket at a time while the
engine keeps generating, parsed into tensors and held aside; ``krl_apply`` (inside the policy's pause) loads
a complete staged version with the model's own ``load_weights`` (vLLM's in-place reload fed an iterator, no
file); ``krl_drop`` forgets a staged version. Nothing of a version touches the model before it is complete.
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

    def _krl_staging(self) -> dict:
        if not hasattr(self, "_krl_staged"):
            self._krl_staged = {}  # key -> {bucket index: [(name, tensor), ...]}
        return self._krl_staged

    def krl_stage(self, key: str, index: int, data: bytes) -> int:
        """Hold bucket ``index`` of version ``key`` (checked by the caller) as tensors; returns buckets held."""
        from cluster.weights.buckets import tensors_of

        staged = self._krl_staging()
        for other in [k for k in staged if k != key]:  # a newer version replaces an abandoned one
            del staged[other]
        staged.setdefault(key, {})[int(index)] = tensors_of(data)
        return len(staged[key])

    def krl_apply(self, key: str, count: int) -> dict:
        """Load all ``count`` staged buckets of ``key`` into the model in place; refuses an incomplete version."""
        buckets = self._krl_staging().pop(key, {})
        if sorted(buckets) != list(range(int(count))):
            raise RuntimeError(f"weights {key}: {len(buckets)} of {count} buckets staged; nothing applied")
        pairs = [pair for i in range(int(count)) for pair in buckets[i]]
        self.reload_weights(weights_iterator=iter(pairs), is_checkpoint_format=True)
        retied = retie_lm_head(self.model_runner.get_model())
        return {"retied": retied, "tensors": len(pairs)}

    def krl_drop(self, key: str = "") -> int:
        """Forget the staged buckets of ``key`` (all with ""); returns how many buckets were dropped."""
        staged = self._krl_staging()
        keys = [k for k in staged if not key or k == key]
        return sum(len(staged.pop(k)) for k in keys)
