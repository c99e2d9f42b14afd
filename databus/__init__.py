"""Databus for Python: change data capture with relays, bootstrap, client and Spark jobs.

The core package holds what every part shares: the event wire format, checkpoints and
their serving rules, filters, Avro schemas, config loading, errors and the command line.
"""

__version__ = "0.1.0"
