"""Multi-node instances (an instance's "nodes"): the private network and Ray."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet import kinds
from vllm_fleet.config.knobs.common import GIB_BYTES, INT64_GIB_MAX, VERSION
from vllm_fleet.config.schema import knob, section

#: Ray refuses a smaller object store (ray/_private/ray_constants.py OBJECT_STORE_MINIMUM_MEMORY_BYTES).
RAY_OBJECT_STORE_MIN_BYTES = 75 * 1024 * 1024


@section('Multi-node instances (Ray; an instance\'s "nodes")')
@dataclass(frozen=True)
class MultiNodeKnobs:
    vllm_private_interface: str | None = knob(
        None, "the nodes' private network interface; None refuses multi-node instances",
        check=lambda v: None if kinds.INTERFACE_RE.fullmatch(v) else f"{v!r} is not a network interface name",
        fix="vllm_private_interface = 'eth1' (the interface of the nodes' isolated network, "
            "as `ip -br addr` shows it), or None",
        notes="""
        The interface of the nodes' private network, e.g. "eth1". vLLM's security guide: inter-node traffic
        (torch.distributed, NCCL, Ray) is unauthenticated and unencrypted and must stay on an isolated
        network. So None, the default, refuses a multi-node instance until it is named: never a guess at
        the public interface. Its address is each node's VLLM_HOST_IP and Ray node address; it is
        NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME. The same name on every node of a group (vLLM copies
        the head's NCCL_* variables to its Ray workers). Offline, vllm_advertise_address stands in for
        the address. Ray's dashboard is off (and on 127.0.0.1); its client server is not installed.
        """)
    vllm_ray_port: int = knob(
        6379, "the head's Ray (GCS) port on the private network; workers join <head>:<this>", low=1024,
        high=65535, must="a port number (1024-65535: Ray runs as the service user)")
    vllm_ray_version: str = knob(
        "2.60.0", "pinned ray, installed into every node's environment (vLLM needs >= 2.48)", **VERSION)
    vllm_ray_object_store_gib: float = knob(
        2.0, "Ray's object store per node, in GiB", low=RAY_OBJECT_STORE_MIN_BYTES / GIB_BYTES, high=INT64_GIB_MAX,
        must=f"a number of GiB from 0.075 (Ray's minimum object store) to {INT64_GIB_MAX} (Ray counts it in bytes "
             "in an int64)",
        notes="""
        Ray's object store per node (Ray's default is 30% of RAM); vLLM passes only small control
        messages through it (tensors between stages go over NCCL). Spills to <vllm_state_dir>/ray-spill.
        """)
