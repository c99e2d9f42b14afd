"""Issue 16's acceptance run: three relays in leader-follower mode on one MariaDB, a
pair of bootstrap services on one PostgreSQL store (``[bootstrap.cluster]``), and a
consumer, on the 3-node ZooKeeper ensemble.

For ``DATABUS_CLUSTER_ACCEPTANCE_SECONDS`` (8 in ``make test``, the issue's 60 in
``make test-full``) a
transfer workload runs: each transaction moves money from an account of one table to
an account of another, so the total over both tables is constant. Meanwhile the leader
is killed with SIGKILL three times and paused once (SIGSTOP past its session
timeout, then SIGCONT), each time at a random moment, and the bootstrap service
running the producer and applier is killed with SIGKILL (its standby takes over).
The consumer (a ``DatabusClient`` given
all three relays) applies every window to a replica of both tables and checks the
total at every window end. At the end:

- the consumer's windows are the source transactions, in commit order, with no gap
  and no repeat (the SCN of each transaction is the binlog position after its COMMIT);
- the invariant held at every window end, and the replica equals the source;
- the cluster never had more than one binlog connection (``SHOW PROCESSLIST`` sampled
  every 20 ms);
- every member ends with the same windows;
- the bootstrap log holds every transaction once, in order, and its snapshot equals
  the source.

It runs twice: ``plain`` (HTTP, no readers, open ZooKeeper nodes) and ``tls-acl`` (DESIGN
18, docs/security.md): every relay and bootstrap service serves TLS and has readers (the
consumer's token granted the two tables, the bootstrap producer's token, and the
members' client certificate granted ``*``, which the relays present to each other with
``[relay.cluster]`` credentials); the consumer and the producer verify the servers
with the test's CA; every ZooKeeper connect string carries digest credentials. At the
end, additionally: every node of both clusters carries the digest ACL (a session
without the credentials can read them but neither set, create under nor delete any:
``NoAuthError``), the members are registered with their ``https://`` URLs, every
relay and bootstrap service answers a read without a reader's credential with 401, and
no log holds a token or the ZooKeeper password.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import READ_ACL_UNSAFE, make_digest_acl

from databus.bootstrap import open_storage
from databus.client import CallbackResult, Consumer, DatabusClient, DataEvent
from databus.filters import FilterSpec
from databus.security import ClientCredentials
from tests.fixtures._certs import PKI
from tests.fixtures.servers import EnsembleChroot, MariaDBServer, PostgresServer, paused
from tests.integration.binlog_support import Sql, fresh_database, source_uri
from tests.integration.bootstrap_support import BootstrapProcess, drop_schema, storage_url
from tests.integration.cluster_support import SESSION_S, cluster_toml, wait_for
from tests.integration.test_relay_cluster import cluster_of, leader_of, stream
from tests.integration.test_relay_cluster_binlog import BinlogConnections
from tests.relay_harness import RelayProcess, get_url
from tests.tiers import FULL, size

pytestmark = [pytest.mark.integration, pytest.mark.acceptance]

SECONDS = size("DATABUS_CLUSTER_ACCEPTANCE_SECONDS", smoke=8, full=60)
DB = "cl_accept"
ACCOUNTS = 40
START = 1_000
TOTAL = 2 * ACCOUNTS * START
# The tls-acl variant's credentials.
CONSUMER_TOKEN = "tok-cl-accept-consumer-5e1a"
PRODUCER_TOKEN = "tok-cl-accept-producer-93c7"
MEMBER_CN = "relay-member"
ZK_USER, ZK_PW = "databus", "zk-cl:accept@pw"
ZK_PUBLIC_ACL = [make_digest_acl(ZK_USER, ZK_PW, all=True), *READ_ACL_UNSAFE]


class Transfers(threading.Thread):
    """Money moved between the two tables, a transaction at a time; notes each SCN."""

    def __init__(self, server: MariaDBServer) -> None:
        super().__init__(daemon=True, name="transfers")
        self.sql = Sql(server, DB)
        self.rng = random.Random(16)
        self.halt = threading.Event()
        self.scns: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = self.rng
        try:
            while not self.halt.is_set():
                amount = rng.randint(1, 50)
                a, b = rng.randint(1, ACCOUNTS), rng.randint(1, ACCOUNTS)
                there = rng.random() < 0.5
                self.scns.append(self.sql.txn(
                    f"UPDATE savings SET balance = balance {'-' if there else '+'} {amount} "
                    f"WHERE id = {a}",
                    f"UPDATE checking SET balance = balance {'+' if there else '-'} {amount} "
                    f"WHERE id = {b}"))
                time.sleep(rng.uniform(0.002, 0.01))
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        assert self.error is None, self.error
        self.sql.close()


class Replica(Consumer):
    """Both tables as the consumer sees them; the total checked at every window end."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[Any, int]] = {"savings": {}, "checking": {}}
        self.windows: list[int] = []
        self.broken: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def on_data_event(self, event: DataEvent) -> CallbackResult:
        table = self.tables[event.source.split(".")[1]]
        assert event.value is not None
        table[event.value["id"]] = int(event.value["balance"])
        return CallbackResult.SUCCESS

    def on_end_data_event_sequence(self, scn: int) -> CallbackResult:
        with self.lock:
            total = sum(self.tables["savings"].values()) + sum(self.tables["checking"].values())
            if total != TOTAL:
                self.broken.append((scn, total))
            self.windows.append(scn)
        return CallbackResult.SUCCESS


def holder(services: list[BootstrapProcess]) -> BootstrapProcess | None:
    """The service running both the producer and the applier, if one does."""
    for service in services:
        if service.proc is None or service.proc.poll() is not None:
            continue
        roles = service.status()["cluster"]["components"]
        if roles["producer"]["role"] == roles["applier"]["role"] == "holder":
            return service
    return None


class Deployment:
    """What the members, the consumer and the test present to each other: nothing
    (``plain``), or TLS, readers and ZooKeeper digest credentials (``tls-acl``, the
    module docstring)."""

    def __init__(self, zk: EnsembleChroot, pki: PKI | None) -> None:
        self.zk = zk
        self.pki = pki
        self.scheme = "http" if pki is None else "https"
        self.zookeeper = zk.hosts if pki is None else f"digest:{ZK_USER}:{ZK_PW}@{zk.hosts}"
        # The members' credentials; the test reads the relays with them too (granted *).
        self.member: ClientCredentials | None = None
        # The consumer's: the test reads the bootstrap services' status with them.
        self.consumer: ClientCredentials | None = None
        if pki is not None:
            cert = pki.client(MEMBER_CN)
            self.member = ClientCredentials.of(ca_file=pki.ca, cert_file=cert.cert,
                                               key_file=cert.key)
            self.consumer = ClientCredentials.of(ca_file=pki.ca, token=CONSUMER_TOKEN)

    def relay_toml(self, name: str) -> str:
        cluster = cluster_toml(self.zk, name, zookeeper=self.zookeeper,
                               credentials=self.member)
        if self.pki is None:
            return cluster
        tables = f'["{DB}.savings", "{DB}.checking"]'
        return cluster + "\n".join([
            "[relay.tls]", f'cert_file = "{self.pki.server.cert}"',
            f'key_file = "{self.pki.server.key}"', f'client_ca_file = "{self.pki.ca}"',
            "[[relay.readers]]", 'name = "consumer"', f"sources = {tables}",
            f'token = "{CONSUMER_TOKEN}"',
            "[[relay.readers]]", 'name = "bootstrap-producer"', f"sources = {tables}",
            f'token = "{PRODUCER_TOKEN}"',
            "[[relay.readers]]", 'name = "members"', 'sources = ["*"]',
            f'client_cert_cn = "{MEMBER_CN}"']) + "\n"

    def bootstrap_toml(self) -> str:
        if self.pki is None:
            return ""
        return "\n".join([
            "[bootstrap.tls]", f'cert_file = "{self.pki.server.cert}"',
            f'key_file = "{self.pki.server.key}"',
            "[[bootstrap.readers]]", 'name = "consumer"',
            f'sources = ["{DB}.savings", "{DB}.checking"]', f'token = "{CONSUMER_TOKEN}"'
        ]) + "\n"

    def producer(self) -> dict[str, object]:
        if self.pki is None:
            return {}
        return {"ca_file": str(self.pki.ca), "token": PRODUCER_TOKEN}

    def client_credentials(self) -> dict[str, Any]:
        if self.pki is None:
            return {}
        return {"ca_file": self.pki.ca, "token": CONSUMER_TOKEN}


def refusals(urls: list[str], deploy: Deployment) -> list[int]:
    """The HTTP status of a read of each of ``urls`` over TLS without a reader's
    credential (the CA only)."""
    assert deploy.pki is not None
    anonymous = ClientCredentials.of(ca_file=deploy.pki.ca)
    out = []
    for url in urls:
        with pytest.raises(urllib.error.HTTPError) as refused:
            get_url(url, anonymous)
        out.append(refused.value.code)
    return out


def zk_nodes(client: Any, path: str) -> list[str]:
    """``path`` and every node under it (those that vanish meanwhile left out)."""
    try:
        children = sorted(client.get_children(path))
    except NoNodeError:  # an ephemeral node of an expired session
        return []
    out = [path]
    for child in children:
        out += zk_nodes(client, f"{path}/{child}")
    return out


def assert_digest_acls(zk: EnsembleChroot, owner: Any, trees: list[str]) -> int:
    """Every node of ``trees`` (and ``/databus``) carries the digest identity with all
    rights and ``world:anyone`` READ: a session without credentials reads it but may
    neither set, create under nor delete it. Returns how many nodes were checked."""
    anonymous = zk.client()
    checked = 0
    assert owner.get_acls("/databus")[0] == ZK_PUBLIC_ACL
    for tree in trees:
        nodes = zk_nodes(owner, tree)
        assert len(nodes) >= 3, (tree, nodes)
        for node in nodes:
            try:
                acl = owner.get_acls(node)[0]
                anonymous.get(node)
            except NoNodeError:
                continue
            assert acl == ZK_PUBLIC_ACL, (node, acl)
            for what, change in (("set", lambda n=node: anonymous.set(n, b"forged")),
                                 ("create under", lambda n=node: anonymous.create(
                                     f"{n}/intruder", b"x")),
                                 ("delete", lambda n=node: anonymous.delete(n))):
                try:
                    change()
                except NoAuthError:
                    continue
                except NoNodeError:  # an ephemeral node of an expired session
                    continue
                raise AssertionError(f"a session without credentials could {what} {node}")
            checked += 1
    return checked


def remove_protected_nodes(zk: EnsembleChroot, owner: Any) -> None:
    """The chroot fixture's cleanup has no credentials: remove the digest's nodes."""
    def removed() -> bool:
        for child in owner.get_children("/"):
            owner.delete(f"/{child}", recursive=True)
        return not owner.get_children("/")
    wait_for(removed, "the test's ZooKeeper nodes removed", timeout=SESSION_S * 5,
             max_interval=0.2)


# make test runs the secure variant (TLS, readers, ZooKeeper ACLs: the same promises and
# more); make test-full runs both. The plain cluster is covered in make test by
# test_relay_cluster*.py and test_bootstrap_cluster.py.
@pytest.mark.parametrize("secure", [False, True] if FULL else [True],
                         ids=["plain", "tls-acl"] if FULL else ["tls-acl"])
def test_transfers_through_leader_kills_and_a_pause(
        tmp_path: Path, mariadb_server: MariaDBServer, postgres_server: PostgresServer,
        zookeeper_chroot: EnsembleChroot, request: pytest.FixtureRequest,
        secure: bool) -> None:
    deploy = Deployment(zookeeper_chroot, request.getfixturevalue("pki") if secure else None)
    acl_nodes = 0
    sql = fresh_database(mariadb_server, DB)
    sql.run("CREATE TABLE savings (id INT PRIMARY KEY, balance BIGINT NOT NULL)",
            "CREATE TABLE checking (id INT PRIMARY KEY, balance BIGINT NOT NULL)")
    # One config for every member, as a cluster is deployed: one server id, so a new
    # leader's binlog connection makes the server end a paused leader's (docs/clusters.md).
    uri = source_uri(mariadb_server, f"{DB}.savings,{DB}.checking")
    relays = []
    for i in range(3):
        home = tmp_path / f"relay{i}"
        home.mkdir()
        relays.append(RelayProcess(home, {"src": uri}, workers=1, capacity_mb=32,
                                   extra_toml=deploy.relay_toml("bank"),
                                   scheme=deploy.scheme, credentials=deploy.member))
    store_url = storage_url("postgresql", tmp_path, request)
    services = []
    for name in ("boot-a", "boot-b"):
        home = tmp_path / name
        home.mkdir()
        services.append(BootstrapProcess(
            home, store_url, [r.url for r in relays], "producer,applier,server",
            extra_toml=deploy.bootstrap_toml(), scheme=deploy.scheme,
            credentials=deploy.consumer, producer=deploy.producer(),
            applier={"poll_interval_ms": 50, "batch_rows": 500},
            cluster={"zookeeper": deploy.zookeeper, "name": "bank-boot",
                     "session_timeout_s": SESSION_S}))
    connections = BinlogConnections(mariadb_server)
    replica = Replica()
    client: DatabusClient | None = None
    writer = Transfers(mariadb_server)
    rng = random.Random(61)
    try:
        for relay in relays:
            relay.start()
        for service in services:
            service.start()
        connections.start()
        leader_of(relays)
        wait_for(lambda: holder(services), "a bootstrap service runs the producer")
        opening = sql.txn(
            "INSERT INTO savings VALUES " + ", ".join(f"({i}, {START})"
                                                      for i in range(1, ACCOUNTS + 1)),
            "INSERT INTO checking VALUES " + ", ".join(f"({i}, {START})"
                                                       for i in range(1, ACCOUNTS + 1)))
        client = DatabusClient([r.url for r in relays], sources=[f"{DB}.savings",
                                                                 f"{DB}.checking"],
                               backoff_max=0.5, **deploy.client_credentials())
        client.register(replica)
        consuming = threading.Thread(target=client.run, daemon=True)
        consuming.start()
        writer.start()
        started = time.monotonic()
        for at, fault in ((0.15, "kill"), (0.35, "kill"), (0.45, "bootstrap"),
                          (0.55, "pause"), (0.75, "kill")):
            at += rng.uniform(-0.03, 0.03)
            time.sleep(max(0.0, started + SECONDS * at - time.monotonic()))
            if fault == "bootstrap":
                running = holder(services)
                assert running is not None
                running.kill()
                wait_for(lambda: holder(services), "the standby bootstrap took over",
                         timeout=SESSION_S * 4)
                continue
            live = [r for r in relays if r.proc is not None and r.proc.poll() is None]
            leader = leader_of(live)
            if fault == "kill":
                leader.kill()
                leader_of([r for r in live if r is not leader])
                leader.start()
            else:
                assert leader.proc is not None
                with paused(leader.proc, seconds=SESSION_S * 2.5):
                    leader_of([r for r in live if r is not leader])
            wait_for(lambda r=leader: cluster_of(r)["cluster"]["role"] == "follower",
                     "the old leader follows")
        time.sleep(max(0.0, started + SECONDS - time.monotonic()))
        writer.stop()
        last = writer.scns[-1]
        wait_for(lambda: replica.windows and replica.windows[-1] >= last,
                 "the consumer at the last transaction", timeout=60)
        wait_for(lambda: all((cluster_of(r)["max_scn"] or 0) >= last for r in relays),
                 "every member at the last transaction", timeout=60)
        bodies = [stream(r, sources=f"{DB}.savings,{DB}.checking") for r in relays]
        assert bodies[0] == bodies[1] == bodies[2]
        store = open_storage(store_url)
        try:
            wait_for(lambda: (store.positions()[0] or 0) >= last,
                     "the bootstrap store applied the last transaction", timeout=60)
            logged = [row.scn for row in store.log_batch(
                [f"{DB}.savings", f"{DB}.checking"], after_scn=-1, upto_scn=1 << 62,
                limit=1 << 30, filter=FilterSpec())]
            snapshot_total = sum(
                1 for t in ("savings", "checking") for _ in store.snapshot_batch(
                    f"{DB}.{t}", after_key=None, since_scn=None, limit=1 << 30,
                    filter=FilterSpec()))
        finally:
            store.close()
        if secure:
            owner = zookeeper_chroot.client(auth_data=[("digest", f"{ZK_USER}:{ZK_PW}")])
            acl_nodes = assert_digest_acls(zookeeper_chroot, owner, [
                "/databus/relays/bank", "/databus/bootstrap/bank-boot"])
            members = owner.get_children("/databus/relays/bank/members")
            assert sorted(json.loads(owner.get(f"/databus/relays/bank/members/{m}")[0])["url"]
                          for m in members) == sorted(r.url for r in relays)
            refused = refusals([f"{r.url}/v1/sources" for r in relays] + [
                f"{s.url}/v1/bootstrap/sources" for s in services
                if s.proc is not None and s.proc.poll() is None], deploy)
            assert set(refused) == {401}, refused
    finally:
        if writer.is_alive():
            writer.halt.set()
        if client is not None:
            client.stop()
        samples = connections.stop()
        for service in services:
            service.kill()
        for relay in relays:
            if relay.proc is not None and relay.proc.poll() is None:
                relay.kill()
        drop_schema(postgres_server, store_url)
        if secure:
            remove_protected_nodes(zookeeper_chroot, zookeeper_chroot.client(
                auth_data=[("digest", f"{ZK_USER}:{ZK_PW}")]))
    source = [opening, *writer.scns]
    # The log: every transaction once (two rows each, the opening one 2 * ACCOUNTS),
    # in order, through the bootstrap failover; the snapshot: every account.
    assert sorted(set(logged)) == source
    assert len(logged) == 2 * ACCOUNTS + 2 * len(writer.scns)
    assert snapshot_total == 2 * ACCOUNTS
    assert len(writer.scns) > 200
    assert replica.windows == source  # every transaction, in commit order, once
    assert replica.broken == []
    want = {t: dict(sql.query(f"SELECT id, balance FROM {t}")) for t in ("savings", "checking")}
    assert replica.tables == want
    sql.close()
    assert samples and max(samples) == 1, samples
    if secure:
        assert acl_nodes >= 10, acl_nodes
        for log in [*(r.log_path for r in relays), *(s.log_path for s in services)]:
            text = log.read_text(errors="replace")
            for secret in (CONSUMER_TOKEN, PRODUCER_TOKEN, ZK_PW):
                assert secret not in text, (log, secret)
