"""The controller's sweep cache (reconcile/cache.py): a version it already holds is not copied again (the watch's
echo of our own status write arrives with the resourceVersion the write's answer was remembered under), a newer
one replaces it, an older one never does; which watch events are our own writes' echoes (dropped before kopf)."""

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
    with mock.patch("sweep_operator.reconcile.cache._dumps") as dumps:
        cache.observe_sweep(_sweep("7", "Starting"))  # the echo of that write
    dumps.assert_not_called()
    assert cache.is_echo(_sweep("7", "Starting"))
    cache.observe_sweep(_sweep("8", "Running"))
    assert (cache.sweep(ref) or {})["status"] == {"phase": "Running"}
    cache.observe_sweep(_sweep("6", "Pending"))  # older: kept out
    assert (cache.sweep(ref) or {})["status"] == {"phase": "Running"}


def _deleting(obj: dict[str, object]) -> dict[str, object]:
    meta = dict(obj["metadata"])
    return {**obj, "metadata": {**meta, "deletionTimestamp": "2026-12-06T00:00:00Z"}}


def test_a_sweeps_echoes_are_the_versions_of_its_last_writes_and_nothing_a_tenant_wrote() -> None:
    cache = Cache(Settings())
    assert not cache.watch_echo("trainingsweeps", _sweep("7", "Starting"))  # nothing written yet
    for rv in ("7", "8", "9", "10", "11"):  # the finalizer patch and status writes of a few passes
        cache.remember_write(_sweep(rv, "Starting"))
    # The last four writes' events may still be on their way; the oldest no longer counts (it would reconcile).
    assert [cache.watch_echo("trainingsweeps", _sweep(rv, "x")) for rv in ("7", "8", "11")] == [False, True, True]
    assert not cache.watch_echo("trainingsweeps", _sweep("12", "Starting"))  # another writer's version
    assert not cache.watch_echo("trainingsweeps", _deleting(_sweep("11", "Starting")))  # the guard sees deletions
    other = {"metadata": {"name": "other", "namespace": "ml", "resourceVersion": "11"}}
    assert not cache.watch_echo("trainingsweeps", other)  # another sweep with the same version number
    assert not cache.watch_echo("rayjobs", _sweep("11", "x"))  # another kind
    cache.forget_sweep(ObjectRef("ml", "digits"))
    assert not cache.watch_echo("trainingsweeps", _sweep("11", "Starting"))  # a recreated sweep starts afresh


def test_a_rayjobs_echo_is_its_creates_answer_only() -> None:
    cache = Cache(Settings())
    made = {"metadata": {"name": "digits-1", "namespace": "ml", "uid": "u1", "resourceVersion": "20"}}
    assert not cache.watch_echo("rayjobs", made)
    cache.remember_created_rayjob(made)
    assert cache.watch_echo("rayjobs", made)
    kuberay = {**made, "metadata": {**made["metadata"], "resourceVersion": "21"}, "status": {"jobStatus": "RUNNING"}}
    assert not cache.watch_echo("rayjobs", kuberay)  # KubeRay's write: news for the sweep
    assert not cache.watch_echo("rayjobs", _deleting(made))
    cache.forget_rayjob(made)
    assert not cache.watch_echo("rayjobs", made)


def test_copies_keep_what_orjson_refuses() -> None:
    cache, ref = Cache(Settings()), ObjectRef("ml", "digits")
    sweep = {**_sweep("7", "Starting"), "spec": {"paramSpace": {"n": 123456789012345678901234567890}}}
    cache.observe_sweep(sweep)
    assert (cache.sweep(ref) or {})["spec"] == {"paramSpace": {"n": 123456789012345678901234567890}}
    cache.observe_sweep({**_sweep("8", "Running"), "spec": {"paramSpace": {"n": 1.5}}})
    assert (cache.sweep(ref) or {})["spec"] == {"paramSpace": {"n": 1.5}}
