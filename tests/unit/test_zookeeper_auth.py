"""ZooKeeper connect strings with digest credentials (DESIGN 18, docs/clusters.md
"ZooKeeper credentials and ACLs"): parsing, the ACLs a session creates its nodes with,
and that the password never shows (``databus.security._zookeeper``,
``databus.coordination.kazoo_client``). The servers' side: tests/integration/
test_zookeeper_acl.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from databus._redact import forget_all, redact
from databus.client._checkpoint_zookeeper import ZooKeeperCheckpointStore
from databus.client._discovery import RelayDiscovery, validate_discovery
from databus.client.group import ZooKeeperCoordinator
from databus.client.group._cli import parse_coordinator
from databus.config import RelayClusterConfig, check_zookeeper_hosts
from databus.coordination import ZooKeeperMember, kazoo_client
from databus.errors import ConfigError
from databus.security import PUBLIC, SENSITIVE, ZooKeeperConnect, parse_zookeeper

PW = "s3cret:p@ss/w0rdz9"  # ':', '@' and '/' in it: the password runs to the last '@'
HOSTS = "zk1:2181,zk2:2181/databus"
CONNECT = f"digest:databus:{PW}@{HOSTS}"


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    forget_all()
    yield
    forget_all()


def test_plain_connect_strings_are_as_before() -> None:
    parsed = parse_zookeeper(HOSTS)
    assert parsed == ZooKeeperConnect(HOSTS)
    assert not parsed.secured and parsed.auth_data == [] and parsed.display == HOSTS
    assert parsed.acl(PUBLIC) is None and parsed.acl(SENSITIVE) is None
    assert parsed.kazoo_kwargs(PUBLIC) == {"hosts": HOSTS}


def test_digest_credentials_are_split_from_the_hosts() -> None:
    parsed = parse_zookeeper(CONNECT)
    assert parsed.hosts == HOSTS and parsed.user == "databus"
    assert parsed.password is not None and parsed.password.reveal() == PW
    assert parsed.auth_data == [("digest", f"databus:{PW}")]
    assert parsed.display == f"digest:databus:***@{HOSTS}"
    assert PW not in repr(parsed) + str(parsed)
    # Registered for redaction the moment it is parsed.
    assert redact(f"connecting with {PW}") == "connecting with ***"


def test_public_nodes_are_readable_by_anyone_and_changed_by_the_digest_only() -> None:
    parsed = parse_zookeeper(CONNECT)
    owner = make_digest_acl("databus", PW, all=True)
    assert parsed.acl(PUBLIC) == [owner, ACL(Permissions.READ, Id("world", "anyone"))]
    assert parsed.acl(SENSITIVE) == [owner]
    assert owner.perms == Permissions.ALL and owner.id.scheme == "digest"
    kwargs = parsed.kazoo_kwargs(SENSITIVE)
    assert kwargs == {"hosts": HOSTS, "auth_data": [("digest", f"databus:{PW}")],
                      "default_acl": [owner]}


def test_the_kazoo_client_carries_the_credentials_and_the_acl() -> None:
    client = kazoo_client(CONNECT, SENSITIVE, timeout=3.0)
    try:
        assert client.auth_data == {("digest", f"databus:{PW}")}
        assert client.default_acl == [make_digest_acl("databus", PW, all=True)]
        assert client.chroot == "/databus"
    finally:
        client.close()
    plain = kazoo_client(HOSTS)
    try:
        assert not plain.auth_data and plain.default_acl is None
    finally:
        plain.close()


def test_a_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZK_TEST_PASSWORD", "from-the-env-pw")
    parsed = parse_zookeeper(f"digest:ops:${{ZK_TEST_PASSWORD}}@{HOSTS}")
    assert parsed.password is not None and parsed.password.reveal() == "from-the-env-pw"
    assert redact("from-the-env-pw") == "***"
    monkeypatch.delenv("ZK_TEST_PASSWORD")
    with pytest.raises(ConfigError, match="ZK_TEST_PASSWORD, which is not set"):
        parse_zookeeper(f"digest:ops:${{ZK_TEST_PASSWORD}}@{HOSTS}")


@pytest.mark.parametrize(("connect", "match"), [
    ("digest:databus@zk1:2181", "user name is missing"),
    ("digest::pw-long-enough@zk1:2181", "user name is missing"),
    ("digest:a b:pw-long-enough@zk1:2181", "user name"),
    ("digest:databus:pw@zk1:2181", "at least 3 characters"),
    ("digest:databus:***@zk1:2181", "is the mask"),
    ("digest:databus:pw-long-enough@zk1:2181;zk2", "expected host:port"),
    ("digest:databus:pw-long-enough@zk1:99999", "port 99999 out of range"),
    ("digest:databus:pw-long-enough@", "expected host:port"),
])
def test_bad_digest_connect_strings_are_clear_errors(connect: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        parse_zookeeper(connect, "relay.cluster.zookeeper")
    assert "pw-long-enough" not in str(caught.value)
    assert str(caught.value).startswith("relay.cluster.zookeeper: ")


@pytest.mark.parametrize("connect", ["admin:s3cret-pw@zk1:2181/c", "sasl:admin:s3cret-pw@zk1",
                                     "s3cret-token@zk1:2181"])
def test_other_credentials_are_refused_and_never_printed(connect: str) -> None:
    with pytest.raises(ConfigError, match="credentials do not go in the connect string"
                       ) as caught:
        check_zookeeper_hosts(connect)
    assert "s3cret" not in str(caught.value)
    assert "s3cret" not in redact(f"echo {connect}")


def test_every_entry_point_takes_the_digest_form_and_never_shows_the_password(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    config = RelayClusterConfig(zookeeper=CONNECT, name="shop")
    validate_discovery(CONNECT, "shop", 5.0)
    discovery = RelayDiscovery(CONNECT, "shop", timeout=1.0)
    store = ZooKeeperCheckpointStore(CONNECT, "c1", timeout=1.0)
    coordinator = ZooKeeperCoordinator(f"zookeeper://{CONNECT}")
    member = ZooKeeperMember(config.zookeeper, 1.0, "/m", "relay.cluster.zookeeper",
                             "http://r1")
    assert coordinator.hosts == CONNECT
    assert parse_coordinator(f"zookeeper://{CONNECT}") == CONNECT
    shown = [repr(discovery), discovery.where, repr(store), store._where, repr(coordinator),
             member.hosts]
    for text in shown:
        assert PW not in text and "digest:databus:***@zk1:2181" in text, text
    logging.getLogger("databus.test").warning("config %r %s", config, config.zookeeper)
    assert PW not in caplog.text and "***" in caplog.text


def test_a_connect_string_without_credentials_is_shown_as_it_is() -> None:
    store = ZooKeeperCheckpointStore(HOSTS, "c1", timeout=1.0)
    assert repr(store) == f"ZooKeeperCheckpointStore('{HOSTS}', path='/databus/checkpoints/c1')"


def test_which_subtrees_are_sensitive() -> None:
    from databus.coordination._acl import exposure_of

    assert exposure_of("/databus") == PUBLIC
    assert exposure_of("/databus/relays/shop/members/member-0000000001") == PUBLIC
    assert exposure_of("/databus/bootstrap/b/stores/s1/producer") == PUBLIC
    assert exposure_of("/databus/groups") == SENSITIVE
    assert exposure_of("/databus/groups/billing/checkpoints/3") == SENSITIVE
    assert exposure_of("/databus/checkpoints/c1") == SENSITIVE
    assert exposure_of("/databus/groupsx") == PUBLIC
    assert exposure_of("/mine/c1", ["/mine/"]) == SENSITIVE


def test_secure_needs_credentials_and_never_prints_them(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from databus.coordination.__main__ import main

    assert main(["secure", "--zookeeper", HOSTS]) == 1
    assert "needs digest credentials" in capsys.readouterr().err
    monkeypatch.setenv("ZK_TEST_OLD", "databus")  # no password
    assert main(["secure", "--zookeeper", CONNECT, "--previous-env", "ZK_TEST_OLD"]) == 1
    out, err = capsys.readouterr()
    assert "previous credentials must be user:password" in err and PW not in out + err
    assert main(["secure", "--zookeeper", CONNECT, "--previous-env", "ZK_TEST_UNSET"]) == 1
    assert "ZK_TEST_UNSET: the variable is not set" in capsys.readouterr().err


def test_check_config_hides_the_digest_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from databus import cli

    monkeypatch.setenv("ZK_TEST_PASSWORD", "zk-s3cret-pw")
    config = tmp_path / "relay.toml"
    config.write_text(
        "[relay]\ndata_dir = '/tmp/x'\nport = 11190\n"
        "[[relay.buffers]]\nname = 'a'\ncapacity_mb = 1\nsource = 'synthetic://'\n"
        "[relay.cluster]\nname = 'shop'\n"
        "zookeeper = 'digest:databus:${ZK_TEST_PASSWORD}@zk1:2181/databus'\n")
    assert cli.main(["check-config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "zk-s3cret-pw" not in out
    assert '"zookeeper": "digest:databus:***@zk1:2181/databus"' in out
