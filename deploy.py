"""Converge every host: `pyinfra -y INVENTORY deploy.py` (add --dry to see the changes only).

Steps, in order, for each host (the logic lives in vllm_fleet/deploy.py):
  0. commands must run as root through the host's connection arguments (_sudo, _su_user, ...): a
     login user without sudo fails that host alone, with what to grant, before anything else
  1. facts (live GPUs, the model's config.json, paths) and the plan; bad input stops the run here,
     before any host is changed; then the host's deploy lock is taken (a second deploy at the
     same time refuses the host, changing nothing on it)
  2. the service user (never root) and the directories it writes; then models given as a
     workstation directory (model_source) are synced to the host (one remote command if unchanged)
  3. the Python environment with the pinned vLLM (uv or conda; from the wheelhouse or an index),
     free space checked first, built aside, `current` switched atomically
  4. OS packages the runtime needs and the host lacks (nginx for the front; a compiler and the Python
     headers where Triton or inductor compile), with apt/dnf, or refused before any change
  5. Hugging Face ids are downloaded into HF_HOME (the token goes in a root-only file, not argv)
  6. engine YAML, root-only env file, units; the front's config and unit; units of removed
     instances are removed
  7. daemon-reload only if a unit changed; restart only the instances whose files or env changed
     (or that still run from before an interrupted deploy changed them); then reload the front
  8. verify each instance over SSH: /health, /v1/models with the key, a 1-token completion
  9. on the fleet's gateway host: vllm-router restarted or reloaded if its unit or backends
     changed (after this host's instances serve: it registers them), then verified; then the
     lock is released (a killed deploy releases it when its SSH session ends)
"""

from pyinfra import host, logger

from vllm_fleet import deploy as step

problem = step.access_problem()  # root through the host's _sudo/_su_user/...? else this host fails
if problem:
    step.refuse_host(problem)
else:
    deployment = step.prepare()
    logger.info(f"{host.print_prefix}plan: {step.describe(deployment)}")
    step.take_lock(deployment)
    step.service_user(deployment)
    step.models(deployment)
    step.environment(deployment)
    step.host_packages(deployment)
    step.hub_models(deployment)
    step.service_files(deployment)
    step.services(deployment)
    step.verify(deployment)
    step.gateway_service(deployment)
    step.release_lock(deployment)
