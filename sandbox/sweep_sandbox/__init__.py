"""Everything on 127.0.0.1: Kubernetes API emulator (kmock), a KubeRay stand-in, and the sandbox CLI (needs the `sandbox` extra)."""
