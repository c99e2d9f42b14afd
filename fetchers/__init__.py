"""Source adapters (fetchers): binlog, trigger/TxLog, synthetic load generator."""
