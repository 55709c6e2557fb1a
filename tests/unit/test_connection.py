"""ConnectionConfig (librdkafka keys, Java properties, secrets masked), the SASL mechanisms
(SCRAM against RFC 7677's test vector), SASL framing against a fake broker, and the
recognition of TLS failures -- no broker needed."""

from __future__ import annotations

import http.server
import json
import ssl
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pyspark_kafka_share._kafka.connection import (
    MASK,
    ConnectionConfig,
    OidcSettings,
    parse_java_properties,
    unsecured_jwt,
)
from pyspark_kafka_share._kafka.protocol import sasl
from pyspark_kafka_share._kafka.protocol.codec import Framer, Reader, Writer
from pyspark_kafka_share._kafka.protocol.transport import check_not_tls_alert, tls_error
from pyspark_kafka_share.errors import (
    AuthenticationError,
    OptionError,
    SecurityProtocolMismatchError,
    TlsError,
)

SECRET = "s3cret-Pw-77"


# -- SCRAM ----------------------------------------------------------------------------------


def test_scram_sha_256_rfc7677_vector() -> None:
    client = sasl.ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.answer(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                          b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert client.answer(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None
    assert client.done


def _scram_after_first(mechanism: str = "SCRAM-SHA-256") -> sasl.ScramClient:
    client = sasl.ScramClient(mechanism, "user", "pencil", nonce="abc")
    client.first()
    client.answer(b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    return client


def test_scram_rejects_a_wrong_server_signature_and_errors() -> None:
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        _scram_after_first().answer(b"v=AAAA")
    with pytest.raises(AuthenticationError, match="invalid-proof"):
        _scram_after_first("SCRAM-SHA-512").answer(b"e=invalid-proof")
    client = sasl.ScramClient("SCRAM-SHA-512", "user", "pencil", nonce="abc")
    with pytest.raises(AuthenticationError, match="nonce"):
        client.answer(b"r=zzz,s=AAAA,i=4096")  # the server's nonce must extend ours


def test_scram_escapes_the_user_name() -> None:
    client = sasl.ScramClient("SCRAM-SHA-512", "a=b,c", "pw", nonce="n")
    assert client.first() == b"n,,n=a=3Db=2Cc,r=n"


def test_plain_and_oauthbearer_messages() -> None:
    assert sasl.plain_initial_response("u", "p") == b"\0u\0p"
    assert sasl.oauthbearer_initial_response("tok", {"k": "v"}) == \
        b"n,,\x01auth=Bearer tok\x01k=v\x01\x01"


def test_session_deadline() -> None:
    assert sasl.session_deadline(0) is None
    assert sasl.session_deadline(10_000, now=100.0) == pytest.approx(108.5)
    assert sasl.session_deadline(2_000, now=100.0) == pytest.approx(101.0)


# -- SASL framing against a fake broker -----------------------------------------------------


class FakeBroker:
    """Answers SaslHandshake v1 and SaslAuthenticate v2 like Kafka, checking the requests."""

    def __init__(self, auth_code: int = 0, lifetime_ms: int = 60_000) -> None:
        self.auth_code, self.lifetime_ms = auth_code, lifetime_ms
        self.seen: list[tuple[int, int, bytes]] = []

    def __call__(self, name: str, frame: bytes, deadline: float) -> bytes:
        r = Reader(frame, flexible=False)
        api, version, corr = r.int16(), r.int16(), r.int32()
        r.nullable_string()  # client id
        if api == sasl.SASL_HANDSHAKE:
            assert (version, r.string()) == (1, "PLAIN")
            w = Writer(False).int32(corr).int16(0).string_array(["PLAIN", "SCRAM-SHA-512"])
            return w.getvalue()
        assert (api, version) == (sasl.SASL_AUTHENTICATE, 2)
        r.flexible = True
        r.skip_tags()  # request header v2
        n = r.uvarint() - 1
        self.seen.append((api, version, r.data[r.pos:r.pos + n]))
        r.pos += n
        r.skip_tags()
        r.expect_end("SaslAuthenticate request")
        w = Writer(True).int32(corr).tags().int16(self.auth_code)
        w.string("bad credentials" if self.auth_code else None)
        w.uvarint(1).int64(self.lifetime_ms).tags()  # empty AuthBytes, lifetime, tags
        return w.getvalue()


VERSIONS: dict[int, tuple[int, int]] = {sasl.SASL_HANDSHAKE: (0, 1),
                                        sasl.SASL_AUTHENTICATE: (0, 2)}


def test_authenticate_plain_frames_and_lifetime() -> None:
    broker = FakeBroker(lifetime_ms=5_000)
    config = ConnectionConfig("SASL_SSL", "PLAIN", "alice", SECRET)
    got = sasl.authenticate(broker, config, VERSIONS, framer=Framer("c", "b:1"), deadline=1e12)
    assert got == 5_000
    assert broker.seen == [(36, 2, b"\0alice\0" + SECRET.encode())]


def test_authentication_failure_names_the_cause_not_the_secret() -> None:
    config = ConnectionConfig("SASL_SSL", "PLAIN", "alice", SECRET)
    with pytest.raises(AuthenticationError) as info:
        sasl.authenticate(FakeBroker(auth_code=58), config, VERSIONS, framer=Framer("c", "b:1"),
                          deadline=1e12)
    text = str(info.value)
    assert "SASL_AUTHENTICATION_FAILED" in text and "'alice'" in text
    assert "sasl.password" in text and SECRET not in text


# -- ConnectionConfig ------------------------------------------------------------------------


def test_defaults_and_validation() -> None:
    assert ConnectionConfig().security_protocol == "PLAINTEXT"
    assert not ConnectionConfig().uses_tls and ConnectionConfig("sasl_ssl", "plain", "u", "p") \
        .uses_sasl
    cases: list[tuple[dict[str, Any], str]] = [
        ({"security_protocol": "TLS"}, "security.protocol"),
        ({"security_protocol": "SASL_SSL"}, "sasl.mechanism"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "SCRAM-SHA-512"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, "sasl.username"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "username": "u"},
         "sasl.password"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}, "oauth_cb"),
        ({"security_protocol": "SSL", "key_file": "k.pem"}, "ssl.certificate.location"),
    ]
    for kwargs, option in cases:
        with pytest.raises(OptionError, match=option):
            ConnectionConfig(**kwargs)


def test_secrets_are_masked_in_repr_str_and_errors() -> None:
    config = ConnectionConfig("SASL_SSL", "SCRAM-SHA-512", "alice", SECRET, key_password=SECRET,
                              cert_file="c.pem", token_provider=lambda _c: (SECRET, 0.0))
    oidc = OidcSettings("https://idp/token", "client", SECRET, "kafka")
    for text in (repr(config), str(config), repr(oidc), str(oidc),
                 repr(ConnectionConfig("SASL_SSL", "OAUTHBEARER", oidc=oidc))):
        assert SECRET not in text
    assert f"password={MASK!r}" in repr(config) and "alice" in repr(config)
    jaas = f'org.apache.kafka.common.security.plain.PlainLoginModule required password="{SECRET}";'
    for bad in ({"sasl.jaas.config": jaas}, {"ssl.keystore.key": SECRET},
                {"ssl.keystore.password": SECRET, "ssl.keystore.location": "k.jks"}):
        with pytest.raises(OptionError) as info:
            ConnectionConfig.from_properties(
                "\n".join(f"{k}={v}" for k, v in bad.items()))
        assert SECRET not in str(info.value)
    with pytest.raises(OptionError) as err:
        ConnectionConfig.from_client_settings({"security.protocol": "SASL_SSL",
                                               "sasl.mechanism": "PLAIN",
                                               "sasl.username": "u", "sasl.password": 42})
    assert "42" not in str(err.value) and MASK in str(err.value)


def test_from_client_settings() -> None:
    config = ConnectionConfig.from_client_settings({
        "bootstrap.servers": "b:9093", "group.id": "g", "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "u", "sasl.password": SECRET,
        "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/c.pem",
        "ssl.key.location": "/k.pem", "ssl.key.password": "kp",
        "ssl.endpoint.identification.algorithm": "none"})
    assert (config.security_protocol, config.sasl_mechanism, config.username) == \
        ("SASL_SSL", "SCRAM-SHA-256", "u")
    assert (config.ca_file, config.cert_file, config.key_file, config.key_password) == \
        ("/ca.pem", "/c.pem", "/k.pem", "kp")
    assert not config.check_hostname
    assert ConnectionConfig.from_client_settings(config.client_settings()) == config


def test_from_client_settings_tokens() -> None:
    def cb(conf: str) -> tuple[str, float]:
        return f"token-for-{conf}", 0.0

    config = ConnectionConfig.from_client_settings({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": cb,
        "sasl.oauthbearer.config": "x"})
    assert config.token_provider is cb and config.oauthbearer_config == "x"
    oidc = ConnectionConfig.from_client_settings({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.token.endpoint.url": "https://t",
        "sasl.oauthbearer.client.id": "id", "sasl.oauthbearer.client.secret": SECRET,
        "sasl.oauthbearer.scope": "kafka", "sasl.oauthbearer.extensions": "logicalCluster=lk"})
    assert oidc.oidc == OidcSettings("https://t", "id", SECRET, "kafka", {"logicalCluster": "lk"})
    with pytest.raises(OptionError, match=r"sasl\.oauthbearer\.client\.secret"):
        ConnectionConfig.from_client_settings({
            "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.token.endpoint.url": "u",
            "sasl.oauthbearer.client.id": "id"})
    unsecured = ConnectionConfig.from_client_settings({
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": "true", "sasl.oauthbearer.config": "principal=al"})
    assert unsecured.token_provider is not None
    token = unsecured.token_provider("")[0]
    assert json.loads(_b64(token.split(".")[1]))["sub"] == "al"


def _b64(part: str) -> bytes:
    import base64

    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def test_unsupported_client_settings_name_the_fix() -> None:
    with pytest.raises(OptionError, match="Kerberos"):
        ConnectionConfig.from_client_settings({"security.protocol": "SASL_SSL",
                                               "sasl.kerberos.keytab": "/k"})
    with pytest.raises(OptionError, match=r"ssl\.ca\.location"):
        ConnectionConfig.from_client_settings({"security.protocol": "SSL", "ssl.ca.pem": "x"})
    with pytest.raises(OptionError, match="https"):
        ConnectionConfig.from_client_settings({"ssl.endpoint.identification.algorithm": "x"})


def test_unsecured_jwt() -> None:
    token, expiry = unsecured_jwt("alice", 60, "s", now=1000.0)
    header, claims, signature = token.split(".")
    assert json.loads(_b64(header)) == {"alg": "none"} and signature == ""
    assert json.loads(_b64(claims)) == {"sub": "alice", "iat": 1000, "exp": 1060, "scope": "s"}
    assert expiry == 1060.0


# -- Java properties -------------------------------------------------------------------------


def test_java_properties_format() -> None:
    text = ("# comment\n! also\n  a = 1\nb:2\nc 3\nd=x\\\n   y\nkey\\ with\\ space=v\n"
            "e=\\u0041\\tb\nempty=\n")
    assert parse_java_properties(text) == {"a": "1", "b": "2", "c": "3", "d": "xy",
                                           "key with space": "v", "e": "A\tb", "empty": ""}


def test_from_properties_sasl_ssl_pem() -> None:
    config, settings = ConnectionConfig.from_properties(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        f'    username="alice" \\\n    password="{SECRET}";\n'
        "ssl.truststore.type=PEM\nssl.truststore.location=/ca.pem\n"
        "ssl.keystore.type=PEM\nssl.keystore.location=/ks.pem\nssl.key.password=kp\n"
        "ssl.endpoint.identification.algorithm=\n")
    assert settings == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                        "sasl.username": "alice", "sasl.password": SECRET,
                        "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/ks.pem",
                        "ssl.key.location": "/ks.pem", "ssl.key.password": "kp",
                        "ssl.endpoint.identification.algorithm": "none"}
    assert (config.username, config.password, config.ca_file, config.check_hostname) == \
        ("alice", SECRET, "/ca.pem", False)


def test_from_properties_oauthbearer() -> None:
    module = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
    config, settings = ConnectionConfig.from_properties(
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n"
        "sasl.oauthbearer.token.endpoint.url=https://idp/token\n"
        f'sasl.jaas.config={module} required clientId="kafka" clientSecret="{SECRET}" '
        'scope="admin";\n')
    assert settings["sasl.oauthbearer.method"] == "oidc"
    assert config.oidc == OidcSettings("https://idp/token", "kafka", SECRET, "admin")
    unsecured, _ = ConnectionConfig.from_properties(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n"
        f'sasl.jaas.config={module} required unsecuredLoginStringClaim_sub="bob";\n')
    assert unsecured.token_provider is not None


@pytest.mark.parametrize(("text", "option", "fix"), [
    ("ssl.truststore.location=/t.jks", "ssl.truststore.type", "ssl.ca.location"),
    ("ssl.truststore.type=PKCS12\nssl.truststore.location=/t.p12", "ssl.truststore.type",
     "ssl.ca.location"),
    ("ssl.keystore.type=JKS\nssl.keystore.location=/k.jks", "ssl.keystore.type",
     "ssl.certificate.location and ssl.key.location"),
    ("sasl.login.callback.handler.class=x.Y", "sasl.login.callback.handler.class",
     "sasl.oauthbearer.method=oidc"),
    ("sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required;",
     "sasl.jaas.config", "GSSAPI"),
    ("no.such.key=1", "no.such.key", "remove it"),
])
def test_from_properties_java_only_settings(text: str, option: str, fix: str) -> None:
    with pytest.raises(OptionError) as info:
        ConnectionConfig.from_properties(text)
    assert info.value.option == option and fix in str(info.value)


# -- TLS recognition -------------------------------------------------------------------------


def test_a_tls_alert_is_not_read_as_a_length() -> None:
    alert = b"\x15\x03\x03\x00"
    assert struct.unpack(">i", alert)[0] == 352518912  # what a plaintext client used to see
    with pytest.raises(SecurityProtocolMismatchError, match=r"security\.protocol=SSL"):
        check_not_tls_alert(alert, "b:9093", ConnectionConfig())
    with pytest.raises(SecurityProtocolMismatchError, match="SASL_SSL"):
        check_not_tls_alert(alert, "b:9093", ConnectionConfig("SASL_PLAINTEXT", "PLAIN", "u", "p"))
    check_not_tls_alert(b"\x00\x00\x00\x10", "b:9092", ConnectionConfig())  # a frame length


def _verify_error(code: int, message: str) -> ssl.SSLCertVerificationError:
    exc = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED]")
    exc.verify_code, exc.verify_message = code, message
    return exc


def test_tls_errors_name_cause_and_option() -> None:
    tls = ConnectionConfig("SSL")
    cases: list[tuple[BaseException, type[Exception], str]] = [
        (_verify_error(62, "Hostname mismatch"), TlsError, "hostname mismatch"),
        (_verify_error(19, "self-signed certificate in certificate chain"), TlsError,
         "ssl.ca.location"),
        (ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] alert"), TlsError,
         "ssl.certificate.location"),
        (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),
         SecurityProtocolMismatchError, "security.protocol=PLAINTEXT"),
    ]
    for exc, cls, text in cases:
        err = tls_error(exc, "host:9093", tls, handshake=True)
        assert type(err) is cls and text in str(err), str(err)


def test_unreadable_tls_files_are_option_errors(tmp_path: Any) -> None:
    from pyspark_kafka_share._kafka.protocol.transport import ssl_context

    with pytest.raises(OptionError, match=r"ssl\.ca\.location"):
        ssl_context(ConnectionConfig("SSL", ca_file=str(tmp_path / "none.pem")))
    with pytest.raises(OptionError, match=r"ssl\.certificate\.location"):
        ssl_context(ConnectionConfig("SSL", cert_file=str(tmp_path / "none.pem")))


# -- OIDC client credentials -----------------------------------------------------------------


@pytest.fixture
def token_endpoint() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            ok = "grant_type=client_credentials" in body and \
                self.headers["Authorization"].startswith("Basic ")
            data = json.dumps({"access_token": "tok", "expires_in": 60}).encode()
            self.send_response(200 if ok else 400)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token"
    server.shutdown()
    server.server_close()


def test_oidc_client_credentials(token_endpoint: str) -> None:
    token, expiry = sasl.oidc_token(OidcSettings(token_endpoint, "id", SECRET, "s"), 5.0)
    assert token == "tok" and expiry > 0
    with pytest.raises(AuthenticationError, match=r"sasl\.oauthbearer\.token\.endpoint") as info:
        sasl.oidc_token(OidcSettings("http://127.0.0.1:9/t", "id", SECRET), 0.5)
    assert SECRET not in str(info.value)


def test_harness_reprs_hide_passwords(tmp_path: Any) -> None:
    from pyspark_kafka_share.harness import LocalKafka
    from pyspark_kafka_share.harness.security import BrokerSecurity

    assert SECRET not in repr(LocalKafka(security="sasl_ssl", users={"alice": SECRET}))
    sec = BrokerSecurity.create("sasl_plaintext", tmp_path, 9092, {"alice": SECRET})
    assert SECRET not in repr(sec)
    assert sec.client_settings("alice", "PLAIN")["sasl.password"] == SECRET


def test_oauth_cb_results_like_confluent_kafka() -> None:
    def four(_conf: str) -> tuple[str, float, str, dict[str, str]]:
        return "tok", 0.0, "principal", {"logicalCluster": "lkc-1"}

    config = ConnectionConfig("SASL_SSL", "OAUTHBEARER", token_provider=four)
    assert sasl.mechanism_for(config, 1.0).first() == \
        b"n,,\x01auth=Bearer tok\x01logicalCluster=lkc-1\x01\x01"

    def broken(_conf: str) -> tuple[str, float]:
        raise RuntimeError(SECRET)

    with pytest.raises(AuthenticationError, match="oauth_cb") as info:
        sasl.mechanism_for(config.with_changes(token_provider=broken), 1.0)
    assert SECRET not in str(info.value)


def test_sasl_settings_are_ignored_without_sasl() -> None:
    config = ConnectionConfig.from_client_settings({"security.protocol": "SSL",
                                                    "sasl.mechanism": "GSSAPI"})
    assert config.sasl_mechanism is None and "sasl.mechanism" not in config.client_settings()
