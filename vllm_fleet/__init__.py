"""vllm-fleet: put vLLM on bare-metal GPU servers with pyinfra, and keep it there.

Stages: validated config (config) -> the fleet (fleet: every host parsed once) -> plan
(pure: plan, gpu_support, catalog, environment) -> render (pure: render, gateway, templating,
templates/) -> the deploy's steps (deploy/) running vllm-fleet's pyinfra facts (facts/: what a host has) and
operations (operations/: what changes there), reaching hosts through connect/ -> the fleet commands
(commands/: check, status, rollout, bundle, unlock, gpus, model-info) -> the CLI. The workstation's
own files and checks (fleet_check, fleet_secrets, tls, wheelhouses) sit between the core and the facts. The scripts that run on hosts are
payloads/; what facts read is judged by pure rules (rules/). Each package imports only from its own
layer or a lower one, and the pure core from nothing outside it (tests/repo/test_import_rules.py).
"""

__version__ = "0.1.0"
