"""The rollout actor: the agent loop, its local and remote tools, the policy backends (vLLM, scripted,
OpenAI-compatible), and weight hot-swap."""
