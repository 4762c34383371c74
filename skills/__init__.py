"""What the agent reads: SKILL.md per backend, workspace templates and worked examples (package data)."""
