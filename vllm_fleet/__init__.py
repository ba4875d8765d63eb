"""vllm-fleet: put vLLM on bare-metal GPU servers with pyinfra, and keep it there.

Stages, one module each: config (validated host data) -> plan (pure) -> render (pure)
-> operations/facts (pyinfra) -> verify (over SSH).
"""

__version__ = "0.1.0"
