"""`source <state-dir>/env` after `sweepctl sandbox up`: the sandbox's environment, and the repository's kubectl and
kubectl-sweep plugin first on PATH (issue 28: `kubectl sweep` was unknown and `kubectl` was the system one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from sweep_sandbox.stack import write_env_file

BIN = Path(sys.executable).parent.absolute()


def test_sourcing_the_env_file_puts_the_repositorys_kubectl_and_its_plugin_first(tmp_path: Path) -> None:
    system = tmp_path / "system-bin"  # a kubectl installed elsewhere, first on the user's PATH
    system.mkdir()
    (system / "kubectl").write_text("#!/bin/sh\necho the system kubectl\n")
    (system / "kubectl").chmod(0o755)
    env_file = tmp_path / "env"
    write_env_file(env_file, {"KUBECONFIG": str(tmp_path / "kube config"), "SWEEP_SANDBOX_BUCKET": "sweeps-sandbox"})
    script = f'source {env_file} && command -v kubectl && echo "$KUBECONFIG" && kubectl sweep --help'
    done = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{system}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    kubectl, kubeconfig, *plugin = done.stdout.splitlines()
    assert kubectl == str(BIN / "kubectl") and kubeconfig == str(tmp_path / "kube config")
    assert any("kubectl sweep" in line for line in plugin), done.stdout


def test_the_env_file_appears_whole_never_written_in_place(tmp_path: Path, monkeypatch: Any) -> None:
    """Whoever waits for the file (a script, the e2e tests) reads it as soon as it exists: it must never exist half
    written, so it is written beside and renamed into place."""
    env_file = tmp_path / "env"
    seen: list[tuple[Path, bool]] = []
    real_write = Path.write_text

    def write_text(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        seen.append((self, env_file.exists()))
        return real_write(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    write_env_file(env_file, {"SWEEP_SANDBOX_BUCKET": "sweeps-sandbox"})
    assert seen and all(path != env_file and not existed for path, existed in seen), seen
    assert "export SWEEP_SANDBOX_BUCKET=sweeps-sandbox\n" in env_file.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"], "nothing partial left beside it"
