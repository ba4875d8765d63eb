"""vllm-fleet: put vLLM on bare-metal GPU servers with pyinfra, and keep it there.

Stages: validated config (settings, config) -> plan (pure: plan, gpu_support, catalog) -> render (pure:
render, gateway, templates/) -> the deploy's steps (deploy: pyinfra operations) on the host (host/:
discovery and facts, operations, verify) -> the fleet commands (commands/: status, rollout, bundle).
"""

__version__ = "0.1.0"
