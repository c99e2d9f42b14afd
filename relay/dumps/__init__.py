"""Dumps (docs/dumps.md): the existing rows of tables, read in chunks without locks
and interleaved with the change stream through watermarks.

- ``_sink``: the watermark step between a fetcher and its buffer (pure, no I/O);
- ``_engine``: the dump manager (requests, control, the state file's lock);
- ``_worker``: one worker per buffer (its thread, its dumps one after another);
- ``_readers``: a dump's chunk readers over key ranges, each one chunk ahead, and the
  gate that makes a default dump give way to the source's writers;
- ``_state``: dump records and the ``dumps.json`` file that makes them resumable;
- ``_admin_client``: ``RelayAdmin``, a blocking client of a relay's dump endpoints.
"""

from databus.relay.dumps._admin_client import RelayAdmin, RelayAnswerError
from databus.relay.dumps._engine import DumpManager, DumpPort, DumpRequest
from databus.relay.dumps._sink import Chunk, DumpSink
from databus.relay.dumps._state import Dump, TableProgress

__all__ = ["Chunk", "Dump", "DumpManager", "DumpPort", "DumpRequest", "DumpSink",
           "RelayAdmin", "RelayAnswerError", "TableProgress"]
