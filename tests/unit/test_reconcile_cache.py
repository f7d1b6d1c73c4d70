"""The controller's sweep cache (reconcile/cache.py): a version it already holds is not copied again (the watch's
echo of our own status write arrives with the resourceVersion the write's answer was remembered under), a newer
one replaces it, an older one never does."""

from __future__ import annotations

from unittest import mock

from sweep_operator.reconcile.cache import Cache
from sweep_operator.reconcile.facts import ObjectRef
from sweep_operator.settings import Settings


def _sweep(rv: str, phase: str) -> dict[str, object]:
    return {"metadata": {"name": "digits", "namespace": "ml", "resourceVersion": rv}, "status": {"phase": phase}}


def test_a_known_version_is_not_copied_again_and_a_newer_one_is() -> None:
    cache, ref = Cache(Settings()), ObjectRef("ml", "digits")
    cache.remember_write(_sweep("7", "Starting"))
    with mock.patch("sweep_operator.reconcile.cache.json.dumps") as dumps:
        cache.observe_sweep(_sweep("7", "Starting"))  # the echo of that write
    dumps.assert_not_called()
    assert cache.is_echo(_sweep("7", "Starting"))
    cache.observe_sweep(_sweep("8", "Running"))
    assert (cache.sweep(ref) or {})["status"] == {"phase": "Running"}
    cache.observe_sweep(_sweep("6", "Pending"))  # older: kept out
    assert (cache.sweep(ref) or {})["status"] == {"phase": "Running"}
