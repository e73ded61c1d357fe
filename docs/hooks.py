"""MkDocs hook: generates the reference pages from the code when the site is built.

The page `reference/pipeline-file.md` is not a file in the repository: it is rendered from
`streamer schema` (pipeline/schema.py) by `streamer.pipeline.reference` at every build, so it
lists exactly the keys that `streamer validate` accepts. The schema itself is published next to
it as `reference/pipeline-v1.schema.json`, for editors. `reference/environment.md`, the table of
every environment variable, is rendered from the registry in `streamer.environment`.
"""

from __future__ import annotations

import json
from typing import Any

from mkdocs.structure.files import File, Files

from streamer.environment import reference_markdown as environment_markdown
from streamer.pipeline.reference import reference_markdown
from streamer.pipeline.schema import json_schema

PAGE = "reference/pipeline-file.md"
SCHEMA = "reference/pipeline-v1.schema.json"
ENVIRONMENT = "reference/environment.md"


def on_files(files: Files, config: Any) -> Files:
    """Add the generated reference pages and the JSON Schema to the site's files."""
    for uri, content in ((PAGE, reference_markdown()),
                         (SCHEMA, json.dumps(json_schema(), indent=2) + "\n"),
                         (ENVIRONMENT, environment_markdown())):
        existing = files.get_file_from_path(uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, uri, content=content))
    return files
