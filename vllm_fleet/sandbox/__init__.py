"""Sandbox fleet: real systemd + sshd hosts on this machine (systemd-nspawn), with simulated GPUs."""
