"""The fleet commands `vllm-fleet` adds to pyinfra's CLI (vllm_fleet/cli.py dispatches to them):
`check` (every problem found without connecting), `status`, `rollout` (with `gateway_drain`, and
`rollback`: a host's snapshot and its restore), `bundle` (the offline wheelhouse), `unlock` (break a
deploy lock whose holder is gone), `gpus` (a host's `gpus` declaration from nvidia-smi), `model_info`
(a model's `model_info` entry), and `connection` (pyinfra's API: connect an inventory's hosts
outside `pyinfra ... deploy.py`)."""
