"""TrainingSweep operator: Ray Tune sweeps over Ray Train V2 in KubeRay RayJobs, bounded and guarded.

The pure cores (spec, policy, rendering, s3_layout, status, verification) never import kopf;
`handlers` is the only kopf-aware module.
"""

__version__ = "0.1.0"
