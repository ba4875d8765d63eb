"""vllm-fleet: put vLLM on bare-metal GPU servers with pyinfra, and keep it there.

Stages: validated config (settings, config) -> the fleet (fleet: every host parsed once) -> plan
(pure: plan, gpu_support, catalog, environment) -> render (pure: render, gateway, templating,
templates/) -> the deploy's steps (deploy: pyinfra operations) on the host (host/: discovery and
facts, operations, verify) -> the fleet commands (commands/: status, rollout, bundle, unlock). The
pure core imports nothing from host/, commands/ or sandbox/ (tests/test_import_rules.py).
"""

__version__ = "0.1.0"
