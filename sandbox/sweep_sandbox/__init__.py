"""Everything on 127.0.0.1: a Kubernetes API emulator (kmock), a KubeRay stand-in, a local Ray runner, an S3 server
and the operator in a thread. A test and demo tool, installed by the operator's `sandbox` extra; not in its wheel."""
