"""Secured listeners for :class:`~pyspark_kafka_share.harness.broker.LocalKafka`: a generated
CA, broker and client certificates (PEM), SASL users and ACLs.

``LocalKafka(security=...)`` chooses the client listener (or several, comma-separated:
``"sasl_ssl,ssl"``, each on its own port, :meth:`BrokerSecurity.bootstrap`):

===================  =============================================================
``"plaintext"``      the default: no TLS, no authentication, no authorizer
``"ssl"``            TLS with client certificates required (mutual TLS); a client's
                     principal is its certificate's CN (``User:alice``)
``"sasl_ssl"``       TLS + SASL PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER
                     (Kafka's unsecured JWT validator: any unsigned token is taken)
``"sasl_plaintext"`` the same SASL mechanisms without TLS
===================  =============================================================

Secured brokers run ``StandardAuthorizer``: only the super user :data:`ADMIN` (whom the
harness itself uses, so ``create_topic``/``produce``/... keep working) may do anything until
ACLs are granted (:meth:`BrokerSecurity.grant`). The controller listener, and an ``INTERNAL``
inter-broker listener, stay plaintext on loopback; their principal ``User:ANONYMOUS`` is a
super user (a local-harness shortcut: never a production layout).

Certificates are made with the ``cryptography`` package (a dev dependency; pip installs it
anywhere): RSA 2048, valid for 10 days. The broker's certificate names ``127.0.0.1`` only,
so connecting to ``localhost`` is a hostname mismatch (a test case).
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share.errors import LocalKafkaError, SetupError
from pyspark_kafka_share.harness import _process

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

__all__ = ["ADMIN", "SECURITY_MODES", "BrokerSecurity", "CertificateAuthority"]

ADMIN = "admin"
"""The harness's own principal: a super user."""

SECURITY_MODES = ("plaintext", "ssl", "sasl_ssl", "sasl_plaintext")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def _crypto() -> Any:
    try:
        from cryptography import x509
    except ImportError:  # pragma: no cover - the dev extra installs it
        raise SetupError("LocalKafka(security=...) and kafka-share broker --security generate "
                         "certificates with the 'cryptography' package: pip install "
                         "'pyspark-kafka-share[local]'") from None
    return x509


class CertificateAuthority:
    """A throw-away CA in ``directory``: ``ca.pem``, and certificates it signs (PEM files)."""

    def __init__(self, directory: Path, name: str = "pyspark-kafka-share test CA") -> None:
        _crypto()
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = self._builder(self._name, self._key.public_key()).add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True)
        self._cert = builder.sign(self._key, _sha256())
        self.ca_file = self._write("ca.pem", self._pem(self._cert))

    def _builder(self, subject: Any, public_key: Any) -> Any:
        from cryptography import x509

        now = datetime.datetime.now(datetime.timezone.utc)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(self._name)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=10)))

    @staticmethod
    def _pem(cert: Any) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return bytes(cert.public_bytes(serialization.Encoding.PEM))

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def issue(self, common_name: str, *, ips: tuple[str, ...] = (), dns: tuple[str, ...] = (),
              key_password: str | None = None) -> tuple[Path, Path]:
        """A certificate for ``common_name`` signed by this CA: ``(cert file, key file)``.

        The cert file holds the certificate and the CA's (a chain); the key is PKCS#8,
        encrypted when ``key_password`` is given.
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = self._builder(subject, key.public_key())
        names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + \
            [x509.DNSName(d) for d in dns]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, _sha256())
        encryption: Any = serialization.BestAvailableEncryption(key_password.encode()) \
            if key_password else serialization.NoEncryption()
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8, encryption)
        stem = common_name + ("-encrypted" if key_password else "")
        return (self._write(f"{stem}.pem", self._pem(cert) + self._pem(self._cert)),
                self._write(f"{stem}.key", key_pem))


def _jaas(mechanism: str, user: str, users: Mapping[str, str]) -> str:
    """A Java client's ``sasl.jaas.config`` for ``user``."""
    if mechanism == "OAUTHBEARER":
        return ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                f'unsecuredLoginStringClaim_sub="{user}";')
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    return (f"org.apache.kafka.common.security.{module} required "
            f'username="{user}" password="{users[user]}";')


def _sha256() -> Any:
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


@dataclass
class BrokerSecurity:
    """The secured side of one LocalKafka: its listeners, CA, certificates and users.

    ``modes`` are the client listeners, each on a port of its own (:meth:`bootstrap`); the
    first is the broker's :attr:`~LocalKafka.bootstrap_servers`. Listener names are the
    modes in capitals (``SASL_SSL://...``).
    """

    modes: tuple[str, ...]
    directory: Path
    ports: dict[str, int]
    internal_port: int
    users: dict[str, str] = field(default_factory=dict, repr=False)  # name -> password
    ca: CertificateAuthority | None = None
    _keystore: Path | None = None

    @classmethod
    def create(cls, security: str, directory: Path, port: int,
               users: Mapping[str, str]) -> BrokerSecurity:
        """``security``: one mode or several, comma-separated (``"sasl_ssl,ssl"``); the first
        listens on ``port``. Makes the certificates (TLS modes) and the admin's password."""
        modes = tuple(m.strip().lower() for m in security.split(",") if m.strip())
        bad = [m for m in modes if m not in SECURITY_MODES[1:]]
        if bad or not modes or len(set(modes)) != len(modes):
            raise LocalKafkaError(f"security={security!r}: give one or more (comma-separated, "
                                  f"each once) of {', '.join(SECURITY_MODES[1:])}")
        ports = {m: port if i == 0 else _process.free_port() for i, m in enumerate(modes)}
        sec = cls(modes, directory, ports, _process.free_port(),
                  {ADMIN: secrets.token_urlsafe(12), **dict(users)})
        if any(m in ("ssl", "sasl_ssl") for m in modes):
            sec.ca = CertificateAuthority(directory)
            cert, key = sec.ca.issue("broker", ips=("127.0.0.1",))
            sec._keystore = directory / "broker-keystore.pem"
            sec._keystore.write_bytes(key.read_bytes() + cert.read_bytes())
        return sec

    def for_port(self, port: int) -> BrokerSecurity:
        """The same CA, broker certificate and users (shared, not copied) on another broker's
        ports: the first mode on ``port``, the other modes and ``INTERNAL`` on free ones (the
        nodes of a :class:`~pyspark_kafka_share.harness.cluster.LocalKafkaCluster`)."""
        ports = {m: port if i == 0 else _process.free_port() for i, m in enumerate(self.modes)}
        return replace(self, ports=ports, internal_port=_process.free_port())

    @property
    def mode(self) -> str:
        """The primary (first) mode."""
        return self.modes[0]

    def _mode(self, mode: str | None) -> str:
        m = self.mode if mode is None else mode.lower()
        if m not in self.modes:
            raise LocalKafkaError(f"the broker has no {m!r} listener (it has {self.modes})")
        return m

    def bootstrap(self, mode: str | None = None) -> str:
        """``127.0.0.1:<port>`` of a listener (``"plaintext"``: the internal one)."""
        if mode is not None and mode.lower() == "plaintext":
            return f"127.0.0.1:{self.internal_port}"
        return f"127.0.0.1:{self.ports[self._mode(mode)]}"

    def server_properties(self, controller_port: int) -> dict[str, str]:
        """The ``server.properties`` entries of the secured client listeners."""
        listeners = [f"{m.upper()}://127.0.0.1:{p}" for m, p in self.ports.items()]
        listeners.append(f"INTERNAL://127.0.0.1:{self.internal_port}")
        props = {
            "listeners": ",".join([*listeners, f"CONTROLLER://127.0.0.1:{controller_port}"]),
            "advertised.listeners": ",".join(listeners),
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": ",".join(
                [f"{m.upper()}:{m.upper()}" for m in self.modes]
                + ["INTERNAL:PLAINTEXT", "CONTROLLER:PLAINTEXT"]),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
        }
        for mode in self.modes:
            if mode in ("ssl", "sasl_ssl"):
                props.update(self._tls_properties(mode))
            if mode.startswith("sasl_"):
                props.update(self._sasl_properties(mode))
        return props

    def _tls_properties(self, mode: str) -> dict[str, str]:
        assert self.ca is not None and self._keystore is not None
        prefix = f"listener.name.{mode}"
        return {
            f"{prefix}.ssl.keystore.type": "PEM",
            f"{prefix}.ssl.keystore.location": str(self._keystore),
            f"{prefix}.ssl.truststore.type": "PEM",
            f"{prefix}.ssl.truststore.location": str(self.ca.ca_file),
            f"{prefix}.ssl.client.auth": "required" if mode == "ssl" else "none",
        }

    def _sasl_properties(self, mode: str) -> dict[str, str]:
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in self.users.items())
        prefix = f"listener.name.{mode}"
        return {
            f"{prefix}.sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            f"{prefix}.plain.sasl.jaas.config":
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f"{plain_users};",
            f"{prefix}.scram-sha-256.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            f"{prefix}.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            f"{prefix}.oauthbearer.sasl.jaas.config":
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                f'unsecuredLoginStringClaim_sub="{ADMIN}";',
        }

    def format_args(self) -> list[str]:
        """Kafka's storage tool arguments that create the SCRAM credentials of the users
        known at start (the admin's included) before the broker first runs."""
        if not any(m.startswith("sasl_") for m in self.modes):
            return []
        return [arg for user, password in self.users.items() for mech in SASL_MECHANISMS[1:3]
                for arg in ("--add-scram", f"{mech}=[name={user},password={password}]")]

    # -- clients -------------------------------------------------------------------------

    def client_cert(self, user: str, key_password: str | None = None) -> tuple[Path, Path]:
        """``(cert, key)`` PEM files of a client certificate with CN ``user`` (made once)."""
        if self.ca is None:
            raise LocalKafkaError(f"security={self.modes} has no TLS: no client certificates")
        stem = user + ("-encrypted" if key_password else "")
        cert, key = self.directory / f"{stem}.pem", self.directory / f"{stem}.key"
        if cert.exists() and key.exists():
            return cert, key
        return self.ca.issue(user, key_password=key_password)

    def client_settings(self, user: str, mechanism: str | None,
                        mode: str | None = None) -> dict[str, Any]:
        """librdkafka settings for ``user`` on a listener (no ``bootstrap.servers``)."""
        m = self._mode(mode)
        out: dict[str, Any] = {"security.protocol": m.upper()}
        if m in ("ssl", "sasl_ssl"):
            assert self.ca is not None
            out["ssl.ca.location"] = str(self.ca.ca_file)
        if m == "ssl":
            cert, key = self.client_cert(user)
            out["ssl.certificate.location"], out["ssl.key.location"] = str(cert), str(key)
        if m.startswith("sasl_"):
            mech = (mechanism or "SCRAM-SHA-512").upper()
            out["sasl.mechanism"] = mech
            if mech == "OAUTHBEARER":
                out["enable.sasl.oauthbearer.unsecure.jwt"] = "true"
                out["sasl.oauthbearer.config"] = f"principal={user}"
            else:
                if user not in self.users:
                    raise LocalKafkaError(f"no user {user!r}: add_user() it first")
                out["sasl.username"], out["sasl.password"] = user, self.users[user]
        return out

    def java_properties(self, user: str, mechanism: str | None, mode: str | None = None) -> str:
        """A Java client properties file's text for ``user`` (``--command-config``)."""
        rd = self.client_settings(user, mechanism, mode)
        lines = [f"security.protocol={rd['security.protocol']}"]
        if "ssl.ca.location" in rd:
            lines += ["ssl.truststore.type=PEM",
                      f"ssl.truststore.location={rd['ssl.ca.location']}"]
        if "ssl.certificate.location" in rd:
            cert, key = self.client_cert(user)
            keystore = self.directory / f"{user}-keystore.pem"
            keystore.write_bytes(key.read_bytes() + cert.read_bytes())
            lines += ["ssl.keystore.type=PEM", f"ssl.keystore.location={keystore}"]
        if "sasl.mechanism" in rd:
            lines.append(f"sasl.mechanism={rd['sasl.mechanism']}")
            lines.append(f"sasl.jaas.config={_jaas(rd['sasl.mechanism'], user, self.users)}")
        return "".join(line + "\n" for line in lines)

    def connection_config(self, user: str, mechanism: str | None,
                          mode: str | None = None) -> ConnectionConfig:
        """The protocol client's config for ``user`` on a listener."""
        return ConnectionConfig.from_client_settings(self.client_settings(user, mechanism, mode))

    # -- users and ACLs --------------------------------------------------------------------

    def add_user(self, admin: AdminClient, name: str, password: str,
                 timeout_s: float = 30.0) -> None:
        """SCRAM-SHA-256 and -512 credentials for ``name`` (PLAIN knows only the users given
        to ``LocalKafka(users=...)``: its JAAS file is read at start)."""
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        for mech in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
            # one request per mechanism: the broker refuses two alterations of one user at once
            up: list[Any] = [UserScramCredentialUpsertion(
                name, ScramCredentialInfo(mech, 4096), password.encode())]
            for fut in admin.alter_user_scram_credentials(up).values():
                fut.result(timeout=timeout_s)
        self.users[name] = password

    @staticmethod
    def grant(admin: AdminClient, principal: str, resource_type: str, name: str,
              operation: str, *, pattern: str = "LITERAL", timeout_s: float = 30.0) -> None:
        """An ALLOW ACL: ``principal`` (``"alice"`` or ``"User:alice"``) may ``operation``
        (READ, WRITE, DESCRIBE, DELETE, ALTER, ALL...) on ``resource_type`` (TOPIC, GROUP,
        CLUSTER, TRANSACTIONAL_ID) ``name``."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        rtype = "BROKER" if resource_type.upper() == "CLUSTER" else resource_type.upper()
        if rtype == "BROKER":
            name = "kafka-cluster"
        who = principal if ":" in principal else f"User:{principal}"
        binding = AclBinding(ResourceType[rtype], name, ResourcePatternType[pattern.upper()],
                             who, "*", AclOperation[operation.upper()], AclPermissionType.ALLOW)
        for fut in admin.create_acls([binding]).values():
            fut.result(timeout=timeout_s)
