"""Package data: files shipped with vllm-fleet (read with importlib.resources)."""
