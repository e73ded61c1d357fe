"""Where a job runs: the Spark session, spark-submit to a cluster, a local standalone cluster,
where keyed subtasks are placed and keep their working directories."""
