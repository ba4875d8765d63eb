"""The fleet commands `vllm-fleet` adds to pyinfra's CLI (vllm_fleet/cli.py dispatches to them):
`status`, `rollout` (with `gateway_drain`), `bundle` (the offline wheelhouse), `unlock` (break a
deploy lock whose holder is gone), and `connection`
(pyinfra's API: connect an inventory's hosts outside `pyinfra ... deploy.py`)."""
