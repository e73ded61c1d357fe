"""streamer: declarative stateful stream processing on Apache Spark.

Pipelines are YAML files of sources, operators and sinks (see PIPELINE_SPEC in the README);
`streamer.pipeline` validates and compiles them and `streamer.runtime` runs them epoch by epoch.
"""

__version__ = "0.1.0"
