"""Monitoring: the fleet's Prometheus, its targets, alert rules and dashboard."""
