"""Client library: consumer API, pull loop, dispatcher, checkpoint stores.

    from databus.client import DatabusClient, Consumer, CallbackResult, FileCheckpointStore

See ``docs/client.md``.
"""

from databus.client._bootstrap_puller import BootstrapError, BootstrapTooOld
from databus.client._checkpoint_postgres import PostgresCheckpointStore
from databus.client._checkpoint_store import (
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
)
from databus.client._checkpoint_zookeeper import ZooKeeperCheckpointStore
from databus.client._client import DatabusClient, RetryBudgetExhausted
from databus.client._consumer import CallbackResult, Consumer
from databus.client._discovery import RelayDiscovery, ZooKeeperUnreachable
from databus.client._events import DataEvent, EndOfWindow, Window
from databus.client._metrics import ClientMetrics
from databus.client._relay_puller import FellOffRelay, RelayError, RelayPuller
from databus.client._runner import CallbackTimeout, ConsumerError
from databus.client.group import assign, partition_of
from databus.client.group._member import ZooKeeperCoordinator

__all__ = [
    "BootstrapError",
    "BootstrapTooOld",
    "CallbackResult",
    "CallbackTimeout",
    "CheckpointStore",
    "ClientMetrics",
    "Consumer",
    "ConsumerError",
    "DataEvent",
    "DatabusClient",
    "EndOfWindow",
    "FellOffRelay",
    "FileCheckpointStore",
    "MemoryCheckpointStore",
    "PostgresCheckpointStore",
    "RelayDiscovery",
    "RelayError",
    "RelayPuller",
    "RetryBudgetExhausted",
    "Window",
    "ZooKeeperCheckpointStore",
    "ZooKeeperCoordinator",
    "ZooKeeperUnreachable",
    "assign",
    "partition_of",
]
