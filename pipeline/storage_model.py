"""The `storage_options:` block of the pipeline file as a pydantic v2 model (issue 38, item 3):
how every `s3://` URL of the job is reached. A key left out is not set (None): its default
is the `AWS_*` variable botocore, s3fs and S3A read, so the model has no other default. The
rule that the block needs an `s3://` URL somewhere in the file stays a function over the whole
file (`schema._storage_options_need_s3`), run beside pydantic (docs/decisions/pydantic.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from streamer.pipeline.yaml_loader import Path
from streamer.pipeline.yaml_model import Text, YamlModel, text

if TYPE_CHECKING:  # what it validates to; pydantic reads the type below
    Url: TypeAlias = str
else:
    Url = text(pattern=r"https?://\S+", hint="an http:// or https:// URL")


class StorageOptionsModel(YamlModel):
    """How every s3:// URL of the job (storage, files sources and sinks) is reached; keys left
    out come from the AWS_* environment variables."""

    endpoint_url: Url | SkipJsonSchema[None] = Field(
        default=None, description="The S3 API's URL, for S3-compatible stores (MinIO, ...); "
        "default: $AWS_ENDPOINT_URL, else AWS.")
    key: Text | SkipJsonSchema[None] = Field(
        default=None, description="Access key id (default: $AWS_ACCESS_KEY_ID, or botocore's "
        "credential chain); write ${VAR} to keep it out of the file.")
    secret: Text | SkipJsonSchema[None] = Field(
        default=None, description="Secret access key (default: $AWS_SECRET_ACCESS_KEY).")
    token: Text | SkipJsonSchema[None] = Field(
        default=None, description="Session token of temporary credentials (default: "
        "$AWS_SESSION_TOKEN).")
    region: Text | SkipJsonSchema[None] = Field(
        default=None, description="Region (default: $AWS_DEFAULT_REGION).")
    anon: bool | SkipJsonSchema[None] = Field(
        default=None, description="Unsigned requests (public buckets).")

    @classmethod
    def called(cls, value: Any, path: Path) -> str | None:
        """Messages name the block `storage_options`, unquoted."""
        return "storage_options"


def storage_options(model: StorageOptionsModel | None) -> dict[str, Any]:
    """A validated `storage_options:` block (or None) as `PipelineSpec.storage_options`: the
    keys it sets (a key not set is left out, for its `AWS_*` variable)."""
    return dict(model.model_dump(exclude_none=True)) if model is not None else {}
