"""The job lifecycle: the coordinator that sequences epochs, one epoch, checkpoint completion,
recovery, savepoints, and job control (registry, control channel, signals)."""
