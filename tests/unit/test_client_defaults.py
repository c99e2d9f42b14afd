"""What a ``DatabusClient`` takes by default: its client id (stable across restarts of
one app, unique per process for a consumer group member) and ``bootstrap=None``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from databus.client import DatabusClient, ZooKeeperCoordinator
from databus.client._client import default_client_id
from databus.errors import ConfigError


def test_the_default_client_id_is_name_and_host_without_the_pid() -> None:
    client = DatabusClient(["http://127.0.0.1:1"], name="billing")
    assert client.client_id == f"billing@{socket.gethostname()}"
    assert str(os.getpid()) not in client.client_id.rpartition("@")[2]


def test_the_default_client_id_is_the_same_in_another_process_of_the_app() -> None:
    # A restart is another process: the id it sends must not change.
    code = ("from databus.client import DatabusClient; "
            "print(DatabusClient(['http://127.0.0.1:1'], name='billing').client_id)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=60).stdout.strip()
    assert other == DatabusClient(["http://127.0.0.1:1"], name="billing").client_id


def test_a_given_client_id_wins() -> None:
    client = DatabusClient(["http://127.0.0.1:1"], name="billing", client_id="billing-7")
    assert client.client_id == "billing-7"


def test_a_group_member_keeps_a_per_process_id() -> None:
    # Its id names its member and owner nodes in ZooKeeper: two members of one app on
    # one host must not share it.
    assert default_client_id("app", group=True) == \
        f"app@{socket.gethostname()}:{os.getpid()}"
    client = DatabusClient(["http://127.0.0.1:1"], name="app", sources=["db.t"],
                           group="g", partitions=4,
                           coordinator=ZooKeeperCoordinator("127.0.0.1:1"))
    assert client.client_id == f"app@{socket.gethostname()}:{os.getpid()}"


def test_bootstrap_none_is_no_bootstrap_service() -> None:
    client = DatabusClient(["http://127.0.0.1:1"], bootstrap=None)
    assert client.bootstrap == []
    assert DatabusClient(["http://127.0.0.1:1"]).bootstrap == []
    assert DatabusClient(["http://127.0.0.1:1"], bootstrap=["http://b:1"]).bootstrap == \
        ["http://b:1"]
    with pytest.raises(ConfigError, match="list of URLs"):
        DatabusClient(["http://127.0.0.1:1"], bootstrap="http://b:1")
