"""Operator-side allowlists (issue 15): runner service accounts per namespace, S3 endpoint hosts, the cap on
verificationTimeoutSeconds; refused at admission (phase Invalid) and by the webhook, naming field and allowed values.
Also the bounded S3 client cache and the dedicated verification pool the webhook never waits on."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sweep_operator.reconcile.controller import SweepController
from sweep_operator.reconcile.guard import GuardTarget
from sweep_operator.s3_clients import S3ClientCache
from sweep_operator.settings import OperatorLimits, Settings, SettingsError, TenancyPolicy
from sweep_operator.validation import validate_sweep
from tests.support.factories import changed, gpu_sweep
from tests.support.fake_kube import FakeKube
from tests.support.waiting import wait_for

TENANCY = TenancyPolicy(
    allowed_service_accounts=("team-a/team-a-runner", "*/sweep-runner"),
    allowed_endpoint_hosts=("*.amazonaws.com", "minio.storage.svc:9000"),
)


def sweep(namespace: str = "team-a", **changes: Any) -> dict[str, Any]:
    doc = changed(gpu_sweep(name="digits"), {k.replace("__", "."): v for k, v in changes.items()})
    doc["metadata"]["namespace"] = namespace
    return doc


def problems(
    doc: dict[str, Any], tenancy: TenancyPolicy = TENANCY, limits: OperatorLimits | None = None
) -> dict[str, str]:
    return {p.path: p.message for p in validate_sweep(doc, limits, tenancy)}


# --- settings -------------------------------------------------------------------------------------


def test_allowlists_come_from_comma_separated_environment_variables() -> None:
    settings = Settings.from_env(
        {
            "SWEEP_ALLOWED_SERVICE_ACCOUNTS": "team-a/team-a-runner, */sweep-runner",
            "SWEEP_ALLOWED_ENDPOINT_HOSTS": "*.amazonaws.com,minio.storage.svc:9000",
            "SWEEP_MAX_VERIFICATION_TIMEOUT_SECONDS": "600",
            "SWEEP_S3_CLIENT_CACHE_SIZE": "4",
            "SWEEP_VERIFICATION_WORKERS": "2",
        }
    )
    assert settings.tenancy == TENANCY
    assert (
        settings.limits.max_verification_timeout_seconds,
        settings.s3_client_cache_size,
        settings.verification_workers,
    ) == (600, 4, 2)


@pytest.mark.parametrize(
    "env, names",
    [
        ({"SWEEP_ALLOWED_SERVICE_ACCOUNTS": "sweep-runner"}, "SWEEP_ALLOWED_SERVICE_ACCOUNTS"),
        ({"SWEEP_ALLOWED_SERVICE_ACCOUNTS": "Team_A/runner"}, "SWEEP_ALLOWED_SERVICE_ACCOUNTS"),
        ({"SWEEP_ALLOWED_ENDPOINT_HOSTS": "https://minio:9000"}, "SWEEP_ALLOWED_ENDPOINT_HOSTS"),
        ({"SWEEP_ALLOWED_ENDPOINT_HOSTS": "*"}, "SWEEP_ALLOWED_ENDPOINT_HOSTS"),
        ({"SWEEP_S3_CLIENT_CACHE_SIZE": "0"}, "SWEEP_S3_CLIENT_CACHE_SIZE"),
        ({"SWEEP_VERIFICATION_WORKERS": "0"}, "SWEEP_VERIFICATION_WORKERS"),
        ({"SWEEP_MAX_VERIFICATION_TIMEOUT_SECONDS": "0"}, "SWEEP_MAX_VERIFICATION_TIMEOUT_SECONDS"),
    ],
)
def test_bad_allowlist_entries_are_refused_at_startup_naming_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError, match=names):
        Settings.from_env(env)


# --- the checks (parse_sweep with the operator's tenancy) ----------------------------------------


def test_an_allowed_service_account_and_endpoint_pass() -> None:
    assert problems(sweep()) == {}
    assert problems(sweep(spec__storage__serviceAccountName="team-a-runner")) == {}
    assert problems(sweep(spec__storage__endpointUrl="https://s3.us-west-2.amazonaws.com")) == {}
    assert problems(sweep(spec__storage__endpointUrl="http://minio.storage.svc:9000")) == {}


def test_a_service_account_allowed_in_another_namespace_only_is_refused_naming_what_is_allowed_here() -> None:
    found = problems(sweep("team-b", spec__storage__serviceAccountName="team-a-runner"))
    assert set(found) == {"spec.storage.serviceAccountName"}
    assert "'team-a-runner'" in found["spec.storage.serviceAccountName"]
    assert "namespace 'team-b'" in found["spec.storage.serviceAccountName"]
    assert found["spec.storage.serviceAccountName"].endswith("allowed: sweep-runner")


def test_a_namespace_with_no_allowed_account_says_so() -> None:
    tenancy = TenancyPolicy(allowed_service_accounts=("team-a/sweep-runner",))
    found = problems(sweep("team-b"), tenancy)
    assert "no service account is allowed" in found["spec.storage.serviceAccountName"]


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://169.254.169.254",  # the instance metadata service: the classic forgery target
        "http://kubernetes.default.svc:443",
        "http://minio.storage.svc:9001",  # the allowed host on another port
        "https://amazonaws.com.attacker.example",
        "https://amazonaws.com",  # *.amazonaws.com means a subdomain
        "http://127.0.0.1:9090",
        "http://s3.amazonaws.com@169.254.169.254",  # userinfo: the host is what follows the '@'
    ],
)
def test_an_endpoint_outside_the_allowed_hosts_is_refused(endpoint: str) -> None:
    found = problems(sweep(spec__storage__endpointUrl=endpoint))
    assert set(found) == {"spec.storage.endpointUrl"}
    assert repr(endpoint) in found["spec.storage.endpointUrl"]
    assert "*.amazonaws.com, minio.storage.svc:9000" in found["spec.storage.endpointUrl"]


def test_without_allowlists_any_account_and_endpoint_pass_as_before() -> None:
    doc = sweep(spec__storage__serviceAccountName="anyone", spec__storage__endpointUrl="http://127.0.0.1:9000")
    assert problems(doc, TenancyPolicy()) == {}


def test_verification_timeout_over_the_operator_cap_is_invalid() -> None:
    limits = OperatorLimits(max_verification_timeout_seconds=600)
    found = problems(sweep(spec__deletion__verificationTimeoutSeconds=601), TenancyPolicy(), limits)
    assert found == {"spec.deletion.verificationTimeoutSeconds": "601s exceeds maxVerificationTimeoutSeconds 600s"}
    assert problems(sweep(spec__deletion__verificationTimeoutSeconds=600), TenancyPolicy(), limits) == {}


# --- enforced by the controller (admission) and the webhook --------------------------------------


class Refuse:
    """Stands for S3 and the verifier: admission and the webhook must never reach them."""

    calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        Refuse.calls += 1
        raise AssertionError("S3 or the verifier was called")


def controller(kube: FakeKube, **kwargs: Any) -> tuple[SweepController, list[tuple[str, str, str]]]:
    events: list[tuple[str, str, str]] = []
    settings = Settings(tenancy=TENANCY, status_poll_seconds=0)
    made = SweepController(
        settings,
        kube,
        Refuse(),
        lambda body, type_, reason, message: events.append((type_, reason, message)),
        verifier=Refuse(),
        **kwargs,
    )
    return made, events


def test_admission_marks_a_refused_sweep_invalid_naming_the_field_and_creates_nothing() -> None:
    kube = FakeKube()
    made, events = controller(kube)
    body = kube.add("TrainingSweep", sweep(spec__storage__endpointUrl="http://169.254.169.254"))
    kube.ensure_finalizer(body)
    made.reconcile_sweep(kube.get_sweep("team-a", "digits"))
    status = kube.get_sweep("team-a", "digits")["status"]
    assert status["phase"] == "Invalid"
    assert "spec.storage.endpointUrl" in status["message"] and "169.254.169.254" in status["message"]
    assert kube.rayjob_names() == []
    assert ("Warning", "Invalid") in [(t, r) for t, r, _ in events]


def test_the_webhook_refuses_the_same_sweeps_without_calling_s3() -> None:
    made, _ = controller(FakeKube())
    Refuse.calls = 0
    refused = made.admission_problems(sweep("team-b", spec__storage__serviceAccountName="team-a-runner"), None)
    assert len(refused) == 1 and refused[0].startswith("spec.storage.serviceAccountName:")
    assert made.admission_problems(sweep(), None) == []
    assert Refuse.calls == 0


def test_the_webhook_answers_while_every_verification_worker_is_stuck_on_s3() -> None:
    """A hung bucket holds the whole verification pool; the webhook's check still answers at once (it runs in
    the webhook's own threads, handlers.sweep_admission, and reaches neither the pool nor S3)."""
    release = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    made, _ = controller(FakeKube(), verification_pool=pool)
    stuck = pool.submit(release.wait, 60)
    try:
        done = threading.Event()
        answer: list[list[str]] = []

        def ask() -> None:
            answer.append(made.admission_problems(sweep(spec__storage__endpointUrl="http://10.0.0.1"), None))
            done.set()

        threading.Thread(target=ask, daemon=True).start()
        assert done.wait(10), "the webhook waited on the verification pool"
        assert answer[0] and answer[0][0].startswith("spec.storage.endpointUrl:")
        assert not stuck.done()
    finally:
        release.set()
        pool.shutdown()


def test_verifications_run_on_the_dedicated_pool_with_the_timeout_capped() -> None:
    seen: list[tuple[str, Any]] = []

    def verifier(client: Any, root: str, **options: Any) -> Any:
        seen.append((threading.current_thread().name, options["timeout_seconds"]))
        return type("R", (), {"verified": True})()

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
    settings = Settings(limits=OperatorLimits(max_verification_timeout_seconds=120))
    made = SweepController(
        settings,
        FakeKube(),
        lambda e, r: object(),
        lambda *a: None,
        verifier=verifier,
        verification_pool=pool,
    )
    try:
        made.reads.verify(GuardTarget(run_root="s3://b/sweeps/team-a/digits-r1", timeout_seconds=900))
    finally:
        pool.shutdown()
    ((thread, timeout),) = seen
    assert thread.startswith("verify") and timeout == 120


# --- the S3 client cache --------------------------------------------------------------------------


def test_the_s3_client_cache_is_bounded_and_drops_the_least_recently_used() -> None:
    built: list[tuple[str, str]] = []
    cache = S3ClientCache(2, lambda endpoint, region: built.append((endpoint, region)) or object())
    a = cache("https://a.example", "us-west-2")
    cache("https://b.example", "us-west-2")
    assert cache("https://a.example", "us-west-2") is a  # a is now the most recent
    cache("https://c.example", "us-west-2")  # drops b
    assert len(cache) == 2
    cache("https://a.example", "us-west-2")
    cache("https://b.example", "us-west-2")
    assert built == [
        ("https://a.example", "us-west-2"),
        ("https://b.example", "us-west-2"),
        ("https://c.example", "us-west-2"),
        ("https://b.example", "us-west-2"),
    ]


def test_a_finishing_reconcile_does_not_queue_behind_the_guards_verifications() -> None:
    """Every guard verification worker is stuck on a hung bucket: a sweep that just succeeded still gets its
    checkpoints verified and its status written by the reconcile (a reconcile worker waiting in the guard's queue
    would stall every tenant's deadlines)."""
    from tests.support.fake_s3 import FakeS3
    from tests.support.fakes import Clock, FakeVerifier

    kube, s3, verifier = FakeKube(), FakeS3(), FakeVerifier()
    release = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    stuck = pool.submit(release.wait, 60)
    made = SweepController(
        Settings(status_poll_seconds=0),
        kube,
        lambda e, r: s3,
        lambda *a: None,
        verifier=verifier,
        clock=Clock(),
        verification_pool=pool,
    )
    try:
        doc = changed(gpu_sweep(name="digits"), {})
        doc["metadata"]["namespace"] = "ml"
        kube.ensure_finalizer(kube.add("TrainingSweep", doc))
        made.reconcile_sweep(kube.get_sweep("ml", "digits"))
        name = kube.get_sweep("ml", "digits")["status"]["rayJobName"]
        kube.set_rayjob_status(name, "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
        for obj in [o for (kind, _, _), o in kube.objects.items() if kind == "RayJob"]:
            made.observe_rayjob(obj)
        done = threading.Event()
        threading.Thread(
            target=lambda: (made.reconcile_sweep(kube.get_sweep("ml", "digits")), done.set()), daemon=True
        ).start()
        assert done.wait(10), "the reconcile waited on the guard's verification pool"
        assert kube.get_sweep("ml", "digits")["status"]["phase"] == "Succeeded"
        # The end-of-run verification runs on its own pool: not behind the stuck guard, not on the reconcile worker.
        status = wait_for(
            lambda: (
                (kube.get_sweep("ml", "digits")["status"].get("checkpoints") or {}).get("verified") is True
                and kube.get_sweep("ml", "digits")["status"]
            ),
            10,
            what="the end-of-run verification",
        )
        assert status["checkpoints"]["verified"] is True and verifier.calls
        assert not stuck.done()
    finally:
        release.set()
        pool.shutdown()
        made.close()


def test_a_slow_bucket_at_the_end_of_a_run_holds_no_reconcile_worker() -> None:
    """Issue 15, item 5: the end-of-run verification of a sweep whose bucket hangs runs on the finish pool; the
    reconcile that saw the sweep end returns at once, and the status is written when the verification returns."""
    from tests.support.fake_s3 import FakeS3
    from tests.support.fakes import Clock, FakeResult

    kube, s3, gate = FakeKube(), FakeS3(), threading.Event()
    entered: list[str] = []

    def hanging_verifier(client: Any, root: str, **_: Any) -> Any:
        entered.append(threading.current_thread().name)
        gate.wait(30)
        return FakeResult(True)

    made = SweepController(
        Settings(status_poll_seconds=0),
        kube,
        lambda e, r: s3,
        lambda *a: None,
        verifier=hanging_verifier,
        clock=Clock(),
        verification_pool=ThreadPoolExecutor(max_workers=1),
    )
    try:
        doc = changed(gpu_sweep(name="digits"), {})
        doc["metadata"]["namespace"] = "ml"
        kube.ensure_finalizer(kube.add("TrainingSweep", doc))
        made.reconcile_sweep(kube.get_sweep("ml", "digits"))
        name = kube.get_sweep("ml", "digits")["status"]["rayJobName"]
        kube.set_rayjob_status(name, "ml", jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
        for obj in [o for (kind, _, _), o in kube.objects.items() if kind == "RayJob"]:
            made.observe_rayjob(obj)
        made.reconcile_sweep(kube.get_sweep("ml", "digits"))  # returns although the verifier hangs
        wait_for(lambda: entered, 10, what="the verification started")
        assert entered[0].startswith("finish-verify")
        assert not (kube.get_sweep("ml", "digits")["status"].get("checkpoints") or {}).get("verifiedAt")
        made.reconcile_sweep(kube.get_sweep("ml", "digits"))  # a tick meanwhile starts no second verification
        gate.set()
        wait_for(
            lambda: (kube.get_sweep("ml", "digits")["status"].get("checkpoints") or {}).get("verifiedAt"),
            10,
            what="the status written after the verification",
        )
        assert len(entered) == 1
    finally:
        gate.set()
        made.close()


def test_the_operator_never_calls_an_endpoint_off_the_allowlist_however_it_learnt_it() -> None:
    """A guard target written before the guard policy (or with it off) may still name a forged endpoint: the
    operator's own wiring (handlers.build_controller, as `python -m sweep_operator` builds it) hands out a client
    that refuses every call, the guard's verification reports it, and nothing is built for or sent to it."""
    from unittest import mock

    import kubernetes

    from sweep_operator import s3 as s3_module
    from sweep_operator.handlers import build_controller
    from sweep_operator.reconcile.guard import GuardTarget
    from sweep_operator.s3_clients import RefusedEndpoint

    settings = Settings(tenancy=TENANCY, s3_endpoint_url="http://minio.default.svc:9000")
    built: list[str] = []
    real_make = s3_module.make_s3_client

    def recording(config: Any) -> Any:
        built.append(config.endpoint_url)
        return real_make(config)

    with mock.patch.object(s3_module, "make_s3_client", recording):
        controller = build_controller(settings, kubernetes.client.ApiClient())  # no request is made
        try:
            refused = controller.s3_client_for("http://169.254.169.254", "us-west-2")
            assert isinstance(refused, RefusedEndpoint) and built == []
            controller.s3_client_for(settings.s3_endpoint_url, "")  # the operator's own default is the platform's
            controller.s3_client_for("https://s3.us-west-2.amazonaws.com", "us-west-2")
            assert built == [settings.s3_endpoint_url, "https://s3.us-west-2.amazonaws.com"]
            target = GuardTarget("s3://bucket/sweeps/team-a/digits-r1", "http://169.254.169.254", "us-west-2")
            result = controller.reads.verify(target)
        finally:
            controller.close()
            controller.verification_pool.shutdown(wait=False, cancel_futures=True)
    assert not result.verified and result.checked == 0
    assert any("169.254.169.254" in p.detail and "allowedEndpointHosts" in p.detail for p in result.problems)
    assert built == [settings.s3_endpoint_url, "https://s3.us-west-2.amazonaws.com"], "a client for the forged host"


def test_an_entry_with_a_port_allows_that_port_only() -> None:
    tenancy = TenancyPolicy(allowed_endpoint_hosts=("*.corp.example:9000", "minio.svc"))
    assert tenancy.endpoint_allowed("http://s3.corp.example:9000")
    assert not tenancy.endpoint_allowed("http://s3.corp.example:9001") and not tenancy.endpoint_allowed(
        "http://s3.corp.example"
    )
    assert tenancy.endpoint_allowed("http://minio.svc:9000") and tenancy.endpoint_allowed("https://minio.svc")
    assert not tenancy.endpoint_allowed("http://minio.svc.attacker.example")


# --- the Ray head's address ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("digits-r1-head-svc.team-a.svc.cluster.local:8265", "http://digits-r1-head-svc.team-a.svc.cluster.local:8265"),
        ("http://10.0.0.7:8265/", "http://10.0.0.7:8265"),
    ],
)
def test_the_dashboard_url_is_a_host_and_port(url: str, base: str) -> None:
    from sweep_operator import ray_jobs

    assert ray_jobs.dashboard_base(url) == base


@pytest.mark.parametrize(
    "url",
    [
        "internal-svc.other.svc:8080/anything?",  # the rest of the request's path becomes a query
        "head:8265/admin",
        "head:8265#",
        "user:pw@head:8265",
        "head:port",
        ":8265",
        "https://head:8265",  # KubeRay speaks plain HTTP to a head (utils.go: "http://" + the URL)
    ],
)
def test_a_dashboard_url_with_more_than_host_and_port_is_refused_and_nothing_is_sent(url: str) -> None:
    from sweep_operator import ray_jobs

    with pytest.raises(ValueError, match="is not host:port"):
        ray_jobs.dashboard_base(url)
    assert not ray_jobs.stop_job(url, "raysubmit_1").asked  # refused before any connection (unit tests: no network)
    assert ray_jobs.job_status(url, "raysubmit_1") is None


def test_every_queue_of_the_controller_is_fair_between_namespaces_and_the_stop_has_several_workers() -> None:
    """Polls, guard checks, end-of-run verifications and graceful stops: each queue's flow is the key's namespace."""
    from sweep_operator.reconcile.controller import STOP_WORKERS
    from sweep_operator.reconcile.deletion_state import GuardKey
    from sweep_operator.reconcile.facts import ObjectRef

    made = SweepController(
        Settings(), FakeKube(), lambda *_: None, lambda *_: None, reconcile_workers=2, guard_workers=2,
        verification_pool=ThreadPoolExecutor(max_workers=1),
    )  # fmt: skip
    try:
        keys = {
            made.queue: ObjectRef("team-a", "s"),
            made.finishing: ObjectRef("team-a", "s"),
            made.guards: GuardKey("RayJob", "team-a", "s-run", "uid"),
            made.stopping: ("team-a", "s-run", "s"),
        }
        for queue, key in keys.items():
            assert queue._flow_of is not None and queue._flow_of(key) == "team-a", queue._name
        assert made.stopping._workers == STOP_WORKERS > 1
    finally:
        made.close()
