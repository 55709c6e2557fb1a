"""Mechanisms that exist once, kept so by reading the sources.

- Client configurations are derived in ``_kafka/settings.py`` only (``ClientSettings``): no
  config dict with a client's connection keys elsewhere, no re-derivation of a derived one,
  no filtering of the user's settings by the private connection prefixes.
- confluent-kafka errors are classified in ``errors.py`` only (``error_code``, ``is_denied``,
  ``is_unknown_topic``, ...): no ``_code`` helpers, no ``args[0]`` digging, no comparison of
  an error's code or name, no ``*_AUTHORIZATION_FAILED`` name sets, no substring checks on an
  exception's text in a module that handles confluent-kafka's errors.
- The protocol's requests are framed by the codec only (no second header encoder).
- The two control transports do not import each other both ways.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pyspark_kafka_share

PACKAGE = Path(pyspark_kafka_share.__file__).parent

# Modules not yet held to these rules (none: keep it that way).
_PENDING: frozenset[str] = frozenset()

_CONFIG_KEY = re.compile(
    r"""["'](bootstrap\.servers|group\.id|enable\.auto\.commit|isolation\.level|"""
    r"""auto\.offset\.reset)["']\s*:(?!\s*[rbf]?["'])""")
_CONFIG_RULES = {
    "a client config dict with a connection key (derive it in ClientSettings)": _CONFIG_KEY,
    "a derived config re-derived": re.compile(
        r"\{\s*\*\*[\w.]*\.(admin|producer|consumer|replay_consumer|control_consumer|"
        r"marker_reader)\("),
    "the private connection prefixes": re.compile(r"_CONNECTION_PREFIXES"),
    "the user's settings filtered by hand": re.compile(r"for \w+, \w+ in [\w.]*\.extra\b"),
}
_ERROR_RULES = {
    "a _code helper": re.compile(r"def _code\w*\("),
    "an ad-hoc denial set": re.compile(r"\b_DENI(ED|ALS)\b|[\"'][A-Z_]*AUTHORIZATION_FAILED[\"']"),
    "args[0] digging": re.compile(r"\.args\[0\]"),
    "an error's code compared": re.compile(r"\.code\(\)\s*(==|!=|in\b|not\b)"),
    "an error's name compared": re.compile(r"\.name\(\)\s*(==|!=)"),
}
_TEXT_MATCH = re.compile(r"\bin\s+str\(\w+\)")


def _sources(*exempt: str) -> list[tuple[str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in _PENDING or any(rel == e or rel.startswith(e) for e in exempt):
            continue
        out.append((rel, path.read_text()))
    return out


def _hits(rules: dict[str, re.Pattern[str]], sources: list[tuple[str, str]]) -> list[str]:
    return [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {why}: {m.group(0)!r}"
            for rel, text in sources for why, rule in rules.items()
            for m in rule.finditer(text)]


def test_client_configs_are_derived_in_settings_only() -> None:
    # The harness configures clients of its own test brokers, not the user's cluster.
    assert _hits(_CONFIG_RULES, _sources("_kafka/settings.py", "harness/")) == []


def test_client_errors_are_classified_in_errors_only() -> None:
    assert _hits(_ERROR_RULES, _sources("errors.py")) == []
    kafka_modules = [(rel, text) for rel, text in _sources("errors.py")
                     if "confluent_kafka" in text]
    assert _hits({"a substring check on an exception's text": _TEXT_MATCH},
                 kafka_modules) == []


def test_requests_are_framed_by_the_codec_only() -> None:
    header = re.compile(r"\.int16\(api_key\)|def _header\(|correlation\s*=\s*0x")
    assert _hits({"a request header encoded by hand": header},
                 _sources("_kafka/protocol/codec.py")) == []


@pytest.mark.parametrize("rules", [_CONFIG_RULES, _ERROR_RULES])
def test_the_rules_catch_what_they_ban(rules: dict[str, re.Pattern[str]]) -> None:
    """Each rule finds the pattern it is named for (a rule that matches nothing is no rule)."""
    banned = {
        "a client config dict with a connection key (derive it in ClientSettings)":
            'conf = {"bootstrap.servers": servers, "group.id": group}',
        "a derived config re-derived": 'conf = {**settings.admin(), "x": 1}',
        "the private connection prefixes": "k.startswith(_CONNECTION_PREFIXES)",
        "the user's settings filtered by hand": "{k: v for k, v in client.extra if k}",
        "a _code helper": "def _code(exc): ...",
        "an ad-hoc denial set": '_DENIED = {"TOPIC_AUTHORIZATION_FAILED"}',
        "args[0] digging": "err = exc.args[0] if exc.args else None",
        "an error's code compared": "if err.code() == KafkaError._PARTITION_EOF:",
        "an error's name compared": 'if e.name() == "UNKNOWN_TOPIC_OR_PART":',
    }
    for why, rule in rules.items():
        assert rule.search(banned[why]), why
    assert not _CONFIG_KEY.search('"bootstrap.servers": "comes from bootstrap_servers",')
    assert _TEXT_MATCH.search('if "UNKNOWN_TOPIC" in str(exc):')
