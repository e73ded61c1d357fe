"""User code named by `process:` operators: imported on the driver (next to the pipeline
file first) and shipped to Spark's Python workers."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamer.pipeline.spec import PipelineSpec


def ship_user_code(spec: PipelineSpec, spark: SparkSession) -> None:
    """Import the modules named in `process:` and ship them to the workers (a package is
    shipped zipped); an import failure is a pipeline error at the operator's line."""
    from streamer.operators.process import (
        ProcessFunctionError,
        load_function_class,
        module_file,
    )
    from streamer.pipeline.exceptions import PipelineError, Problem

    base = os.path.dirname(os.path.abspath(spec.file)) if os.path.exists(
        spec.file) else os.getcwd()
    for op in spec.operators:
        if not op.process:
            continue
        try:
            load_function_class(op.process, base, op.id)
        except ProcessFunctionError as exc:
            where = spec.where((*op.path, "process"))
            raise PipelineError([Problem(where, str(exc))]) from exc
        path = module_file(op.process)
        if path and os.path.isfile(path):
            spark.sparkContext.addPyFile(path)
        elif path:  # a package: ship it zipped
            import shutil
            import tempfile

            archive = shutil.make_archive(
                os.path.join(tempfile.mkdtemp(prefix="streamer-py-"), os.path.basename(path)),
                "zip", os.path.dirname(path), os.path.basename(path))
            spark.sparkContext.addPyFile(archive)
