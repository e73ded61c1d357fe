"""`type: kafka`: the source (partitions read by offset range) and the sink (JSON values,
transactions in exactly_once mode), with the client settings both share."""
