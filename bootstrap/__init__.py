"""Bootstrap service: log writer, log applier, snapshot storage, HTTP server.

The public surface other packages use: the storage interface (``open_storage``,
``BootstrapStorage``, ``stored_event``) and the layout of the SQL stores (table names
and state keys), which the Spark jobs read and write directly.
"""

from databus.bootstrap._sql import (
    APPLIED_SCN,
    APPLIER_NEW_KEYS,
    APPLIER_ROWS,
    KEY_HASH,
    LOG_FLOOR_SCN,
    PRODUCER_CHECKPOINT,
    log_table,
    snapshot_table,
)
from databus.bootstrap._storage import BootstrapStorage, StoredEvent, open_storage, stored_event

__all__ = [
    "APPLIED_SCN",
    "APPLIER_NEW_KEYS",
    "APPLIER_ROWS",
    "KEY_HASH",
    "LOG_FLOOR_SCN",
    "PRODUCER_CHECKPOINT",
    "BootstrapStorage",
    "StoredEvent",
    "log_table",
    "open_storage",
    "snapshot_table",
    "stored_event",
]
