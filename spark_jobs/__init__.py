"""PySpark jobs: snapshot compaction, seeding and Parquet export."""
