"""The continuous mode's source side (`job.execution.mode: continuous`): a source subtask
(`source_subtask`), the splits it reads, files or Kafka partitions, with their positions at
each barrier (`source_splits`), and the bad records it meets, staged per checkpoint as dead
letters (`source_records`). The gang that runs them with the keyed subtasks, and its
checkpoints, are the job lifecycle's (`runtime.job.gang`, `runtime.job.barrier_coordinator`)."""
