"""`streamer init NAME`: the project it creates passes `streamer validate` and `streamer test`
on real Spark as it is; it never overwrites a file; a bad name is one message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from streamer.cli.main import app

runner = CliRunner()
FILES = ["pipeline.yaml", "README.md", "requirements.txt", ".github/workflows/streamer.yml",
         ".gitignore"]


@pytest.mark.spark
def test_the_scaffold_validates_and_its_tests_pass(spark, tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", "shop-metrics", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    root = tmp_path / "shop-metrics"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(
        FILES)
    pipeline = root / "pipeline.yaml"
    data = yaml.safe_load(pipeline.read_text())
    assert data["name"] == "shop-metrics"
    assert [o.get("filter") is not None or "window" in o for o in data["operators"]] == [
        True, True]
    result = runner.invoke(app, ["validate", str(pipeline)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["test", str(pipeline)])
    assert result.exit_code == 0, result.output
    assert "1 passed, 0 failed" in result.output
    # The CI workflow runs exactly those two commands, from the project's folder.
    workflow = yaml.safe_load((root / ".github/workflows/streamer.yml").read_text())
    runs = [step["run"] for step in workflow["jobs"]["pipeline"]["steps"] if "run" in step]
    assert runs == ["pip install -r requirements.txt", "streamer validate pipeline.yaml",
                    "streamer test pipeline.yaml"]


def test_existing_files_are_never_overwritten(tmp_path: Path) -> None:
    root = tmp_path / "shop"
    root.mkdir()
    (root / "README.md").write_text("mine\n")
    result = runner.invoke(app, ["init", "shop", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"not overwriting {root / 'README.md'}; choose another name or --dir" in " ".join(
        result.output.split())
    assert "Traceback" not in result.output
    assert (root / "README.md").read_text() == "mine\n"
    assert sorted(p.name for p in root.iterdir()) == ["README.md"]  # nothing else created


def test_a_name_that_cannot_name_a_job_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", "Shop_Metrics", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "'Shop_Metrics' cannot name a job: use lowercase letters, digits and dashes" in (
        " ".join(result.output.split()))
    assert list(tmp_path.iterdir()) == []
