"""The Arrow path: what runs in Python tasks with Arrow instead of Spark, exactly where the
result is certainly Spark's. `arrow_sql` translates the stateless operators Spark analyzed
(filters, selects, derived columns) into Arrow compute calls, or says why not; `arrow_input`
plans and runs the tasks that read a keyed stage's input (local files, Kafka ranges), decode
it with the codecs of `connectors.arrow`, compute its event time and those operators, and
write what the keyed subtasks read. Anything refused is Spark's, in the same epoch.
The continuous mode's source subtasks (`runtime.continuous`) decode with the same code."""
