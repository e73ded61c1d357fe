"""The building blocks of continuous execution (issue 36), free of Spark: what a long-running
keyed subtask does with its input channels, and how tasks send each other records.

- `alignment`: barrier alignment over a subtask's input channels (records, watermarks,
  barriers, idleness and end of input per channel; a snapshot once every channel has
  delivered the barrier; the watermark as the minimum over the active channels);
- `flight`: an exchange between tasks over Arrow Flight: a subtask serves its input
  channels, upstream subtasks push Arrow record batches and control messages to it, with
  bounded buffers and credit-based flow control;
- `gate`: a subtask's input gate, which reads the exchange's channels through the aligner
  and leaves a blocked channel's messages in the exchange (so its sender runs out of credit);
- `coordination`: the control plane between the driver's coordinator and the subtasks:
  barrier streams down to the sources, acknowledgements up.

The package imports only the core: Spark tasks (operators/) and the driver (runtime/) both
may use it. docs/architecture.md, "Continuous execution (issue 36)", says what is built and
what is not.
"""
