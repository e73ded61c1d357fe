"""The epoch runtime on Spark: the planner and its stages, the keyed stage's Spark plan, and
the packages `job` (the job lifecycle), `cluster` (where a job runs) and `observe` (what it
reports)."""
