"""The emulator served on 127.0.0.1 from a thread of its own (EmulatorServer), optionally over TLS with a self-signed
certificate, and the clients and kubeconfigs that reach it."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp.web
import yaml

from .emulator_tables import resource_key

if TYPE_CHECKING:
    from .emulator import KubernetesApiEmulator

Obj = dict[str, Any]


def make_api_client(url: str, token: str | None = None, ca_file: str | None = None) -> Any:
    """A kubernetes.client.ApiClient for `url` from an explicit Configuration (no kubeconfig, no environment),
    authenticating with `token` when given (the emulator's users: admission.py), trusting `ca_file` for https."""
    import kubernetes.client

    configuration = kubernetes.client.Configuration(host=url)
    configuration.verify_ssl = ca_file is not None
    configuration.ssl_ca_cert = ca_file
    client = kubernetes.client.ApiClient(configuration)
    if token:
        client.set_default_header("Authorization", f"Bearer {token}")
    return client


def kubeconfig_document(
    url: str,
    context: str = "sandbox",
    namespace: str = "default",
    users: Mapping[str, str] | None = None,
    ca_pem: bytes | None = None,
) -> Obj:
    """A kubeconfig whose current context is `context` (token `sandbox`: the emulator's administrator); `users`
    adds a context per user (context name -> token) on the same cluster and namespace. kubectl sends a token over
    TLS only (clientcmd DirectClientConfig.ClientConfig): `ca_pem` is the certificate of an https `url`."""
    tokens = {context: "sandbox", **(users or {})}
    cluster: Obj = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}} for name, token in tokens.items()],
        "contexts": [
            {"name": name, "context": {"cluster": context, "user": name, "namespace": namespace}} for name in tokens
        ],
        "current-context": context,
        "preferences": {},
    }


def _self_signed_server(host: str) -> tuple[bytes, Any]:
    """A certificate for `host` (an IP address SAN) signed by its own key, and a server context serving it."""
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes-api-emulator")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as folder:  # load_cert_chain reads files only
        (Path(folder) / "tls.crt").write_bytes(cert_pem)
        (Path(folder) / "tls.key").write_bytes(key_pem)
        context.load_cert_chain(Path(folder) / "tls.crt", Path(folder) / "tls.key")
    return cert_pem, context


class EmulatorServer:
    """Runs a KubernetesApiEmulator on 127.0.0.1 in a background thread with its own event loop.

    with EmulatorServer() as server:          # or server.start() ... server.stop()
        server.write_kubeconfig(path)
        api = server.api_client()
    """

    def __init__(
        self,
        emulator: KubernetesApiEmulator | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: bool = False,
    ) -> None:
        """`tls`: serve https with a self-signed certificate for 127.0.0.1 (`ca_pem`), which a kubeconfig with
        tokens needs: kubectl sends them over TLS only."""
        if emulator is None:
            from .emulator import build_emulator  # the emulator module re-exports this one's names

            emulator = build_emulator()
        self.emulator = emulator
        self.host = host
        self.port = port
        self.ca_pem: bytes | None = None
        self.ca_file: str | None = None  # ca_pem in a file, for clients that read one
        self._ssl: Any = None
        if tls:
            self.ca_pem, self._ssl = _self_signed_server(host)
            self._ca_dir = tempfile.TemporaryDirectory(prefix="emulator-ca-")
            self.ca_file = str(Path(self._ca_dir.name) / "ca.crt")
            Path(self.ca_file).write_bytes(self.ca_pem)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        if not self._ready.is_set():
            raise RuntimeError("the emulator server is not running")
        return f"{'https' if self._ssl is not None else 'http'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 10.0) -> str:
        """Start serving; returns the URL (http://127.0.0.1:<port>)."""
        if self._thread is not None:
            raise RuntimeError("the emulator server is already running")
        self._thread = threading.Thread(target=self._run, name="kubernetes-api-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the emulator server did not start in time")
        if self._failure is not None:
            raise RuntimeError("the emulator server failed to start") from self._failure
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving: watch streams end, the port closes, the thread exits."""
        if self._thread is None or self._loop is None:
            return
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError("the emulator server did not stop in time")
        self._thread = None
        self._ready.clear()

    def __enter__(self) -> EmulatorServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run `fn()` in the server's loop (safe access to `emulator.objects` and friends) and return its result."""
        if self._loop is None:
            raise RuntimeError("the emulator server is not running")

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def history(self, group: str, version: str, plural: str, namespace: str | None, name: str) -> list[Obj]:
        """Every retained state of one object, oldest first (a DELETED change contributes its last state)."""
        key = resource_key(group, version, plural)
        return self.call(lambda: [copy.deepcopy(c.obj) for c in self.emulator.changes.of(key, namespace, name)])

    def write_kubeconfig(
        self, path: str | Path, namespace: str = "default", users: Mapping[str, str] | None = None
    ) -> Path:
        """`users`: a context per user, context name -> token (see kubeconfig_document)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        document = kubeconfig_document(self.url, namespace=namespace, users=users, ca_pem=self.ca_pem)
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    def api_client(self, token: str | None = None) -> Any:
        return make_api_client(self.url, token, self.ca_file)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to start(); the thread must not die silently
            self._failure = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        async with self.emulator:
            server = aiohttp.web.Server(self.emulator, handler_cancellation=True)
            runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, self.host, self.port, ssl_context=self._ssl)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                self.emulator.stop_watches()
                await runner.cleanup()
                await self.emulator.admission.close()
