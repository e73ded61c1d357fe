"""The physical planner: how each part of a compiled dataflow runs. `physical` builds the
stages an epoch runs (`stages/`: sources, stateless chains, keyed operators, sinks) and the
strategy of each; `mode_plan` chooses between epochs and the continuous mode; `keyed_plan`,
`join_plan` and `local` are the keyed stage's Spark plan, a join's driver side and the local
epochs that run without Spark jobs."""
