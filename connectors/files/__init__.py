"""`type: files`: the source and the sink of jsonl, csv and parquet files under an fsspec URL,
the sink's manifests on object stores, and Spark's own S3A access to `s3://` paths."""
