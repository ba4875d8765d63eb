"""Settings for every host of inventory/prod.py (the group named after the file)."""

ssh_user = "deploy"
_sudo = True  # pyinfra: run operations with sudo
