"""Converge every host: `pyinfra -y INVENTORY deploy.py` (add --dry to see the changes only).

Steps, in order, for each host (the logic lives in vllm_fleet/deploy.py):
  1-2. facts (live GPUs, the model's config.json, paths) and the plan; bad input stops the run here,
       before any host is changed
  0.   models given as a workstation directory (model_source) are synced to the host
  3.   the Python environment with the pinned vLLM, built aside, `current` switched atomically
  4.   service user, directories, engine YAML, root-only env file, units; removed instances' units go
  5.   daemon-reload only if a unit changed; restart only the instances whose files or env changed
  6.   verify each instance over SSH: /health, /v1/models with the key, a 1-token completion
"""

from pyinfra import host, logger

from vllm_fleet import deploy as step

deployment = step.prepare()
logger.info(f"{host.print_prefix}plan: {step.describe(deployment)}")
step.models(deployment)
step.environment(deployment)
step.service_files(deployment)
step.services(deployment)
step.verify(deployment)
