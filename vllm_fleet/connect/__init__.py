"""How vllm-fleet reaches a host beyond pyinfra's operations and facts.

- `remote`: every command vllm-fleet sends itself, with the host's sudo/su/doas, as pyinfra would
- `lock`: one deploy at a time per host, held for as long as the deploy's connection
- `ssh_lost`: a dropped SSH connection fails its host with a message instead of the whole run
"""
