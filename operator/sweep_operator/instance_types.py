"""Built-in table of EKS GPU instance types and what one node can give a single Ray worker pod (R14).

A worker pod must fit one node: CPU/GPU totals across a group prove nothing about one bundle.
What a pod can use is the node's capacity minus an allowance for the system:

* CPU: EKS's kube-reserved formula (6% of the first core, 1% of the second, 0.5% of cores 3-4,
  0.25% of the rest) plus 0.5 vCPU for node DaemonSets (aws-node, kube-proxy, the NVIDIA device
  plugin, CSI and log agents).
* Memory: EKS's kube-reserved (255 MiB + 11 MiB per pod at 110 pods), the 100 MiB hard-eviction
  threshold, and 1 GiB for node DaemonSets.

The numbers are deliberately conservative: a spec that passes here can still meet an EC2 supply
shortage (R6, R20), but never a bundle that cannot fit any node of its type.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Final

GIB: Final = 1024**3
MIB: Final = 1024**2

DAEMONSET_CPU: Final = Decimal("0.5")
DAEMONSET_MEMORY: Final = 1 * GIB
EVICTION_MEMORY: Final = 100 * MIB
MAX_PODS_FOR_RESERVATION: Final = 110


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    vcpus: int
    memory_gib: int
    gpu_model: str

    @property
    def allocatable_cpu(self) -> Decimal:
        """vCPUs a pod can request after kube-reserved and DaemonSets."""
        return Decimal(self.vcpus) - kube_reserved_cpu(self.vcpus) - DAEMONSET_CPU

    @property
    def allocatable_memory(self) -> int:
        """Bytes a pod can request after kube-reserved, eviction threshold and DaemonSets."""
        return self.memory_gib * GIB - kube_reserved_memory() - EVICTION_MEMORY - DAEMONSET_MEMORY


def kube_reserved_cpu(vcpus: int) -> Decimal:
    """EKS AMI kube-reserved CPU, in cores."""
    steps = ((1, Decimal("0.06")), (1, Decimal("0.01")), (2, Decimal("0.005")))
    reserved, left = Decimal(0), vcpus
    for cores, share in steps:
        used = min(cores, left)
        reserved += used * share
        left -= used
    return reserved + max(left, 0) * Decimal("0.0025")


def kube_reserved_memory() -> int:
    """EKS AMI kube-reserved memory, in bytes."""
    return 255 * MIB + 11 * MIB * MAX_PODS_FOR_RESERVATION


def _family(gpu_model: str, *rows: tuple[str, int, int, int]) -> list[InstanceType]:
    return [InstanceType(name, gpus, vcpus, mem, gpu_model) for name, gpus, vcpus, mem in rows]


# (name, GPUs, vCPUs, memory GiB) from the EC2 accelerated-computing instance pages.
INSTANCE_TYPES: Final[dict[str, InstanceType]] = {
    t.name: t
    for t in [
        *_family(
            "NVIDIA T4",
            ("g4dn.xlarge", 1, 4, 16),
            ("g4dn.2xlarge", 1, 8, 32),
            ("g4dn.4xlarge", 1, 16, 64),
            ("g4dn.8xlarge", 1, 32, 128),
            ("g4dn.16xlarge", 1, 64, 256),
            ("g4dn.12xlarge", 4, 48, 192),
            ("g4dn.metal", 8, 96, 384),
        ),
        *_family(
            "NVIDIA A10G",
            ("g5.xlarge", 1, 4, 16),
            ("g5.2xlarge", 1, 8, 32),
            ("g5.4xlarge", 1, 16, 64),
            ("g5.8xlarge", 1, 32, 128),
            ("g5.16xlarge", 1, 64, 256),
            ("g5.12xlarge", 4, 48, 192),
            ("g5.24xlarge", 4, 96, 384),
            ("g5.48xlarge", 8, 192, 768),
        ),
        *_family(
            "NVIDIA L4",
            ("g6.xlarge", 1, 4, 16),
            ("g6.2xlarge", 1, 8, 32),
            ("g6.4xlarge", 1, 16, 64),
            ("g6.8xlarge", 1, 32, 128),
            ("g6.16xlarge", 1, 64, 256),
            ("g6.12xlarge", 4, 48, 192),
            ("g6.24xlarge", 4, 96, 384),
            ("g6.48xlarge", 8, 192, 768),
        ),
        *_family(
            "NVIDIA L40S",
            ("g6e.xlarge", 1, 4, 32),
            ("g6e.2xlarge", 1, 8, 64),
            ("g6e.4xlarge", 1, 16, 128),
            ("g6e.8xlarge", 1, 32, 256),
            ("g6e.16xlarge", 1, 64, 512),
            ("g6e.12xlarge", 4, 48, 384),
            ("g6e.24xlarge", 4, 96, 768),
            ("g6e.48xlarge", 8, 192, 1536),
        ),
        *_family(
            "NVIDIA V100",
            ("p3.2xlarge", 1, 8, 61),
            ("p3.8xlarge", 4, 32, 244),
            ("p3.16xlarge", 8, 64, 488),
            ("p3dn.24xlarge", 8, 96, 768),
        ),
        *_family("NVIDIA A100 40GB", ("p4d.24xlarge", 8, 96, 1152)),
        *_family("NVIDIA A100 80GB", ("p4de.24xlarge", 8, 96, 1152)),
        *_family("NVIDIA H100", ("p5.4xlarge", 1, 16, 256), ("p5.48xlarge", 8, 192, 2048)),
        *_family("NVIDIA H200", ("p5e.48xlarge", 8, 192, 2048), ("p5en.48xlarge", 8, 192, 2048)),
    ]
}


def lookup(name: str) -> InstanceType | None:
    return INSTANCE_TYPES.get(name)


def fmt_cores(value: Decimal) -> str:
    return f"{value.quantize(Decimal('0.01')).normalize():f}"


def fmt_gib(value: int | Decimal) -> str:
    return f"{Decimal(value) / GIB:.1f}Gi"
