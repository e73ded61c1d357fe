"""`streamer` commands. Each parses its options, builds a config and calls the library;
pyspark is imported only inside commands that need Spark, so `--help` is instant.
"""

from __future__ import annotations

import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from streamer import __version__
from streamer.cli.errors import boundary, err_console, state
from streamer.cli.launch import parse_conf, run_job
from streamer.cli.output import stdout_console
from streamer.exceptions import StreamerError

app = typer.Typer(
    name="streamer",
    help="Run declarative stateful stream-processing pipelines (YAML) on Apache Spark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

FileArg = Annotated[Path, typer.Argument(help="The pipeline YAML file.", show_default=False)]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"streamer {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Run declarative stateful stream-processing pipelines (YAML) on Apache Spark."""
    state["debug"] = debug


class PlanFormat(StrEnum):
    """Output formats of `streamer plan`."""

    tree = "tree"
    mermaid = "mermaid"
    dot = "dot"
    json = "json"


@app.command()
@boundary
def validate(
    files: Annotated[list[Path], typer.Argument(help="Pipeline YAML files to check.",
                                                show_default=False)],
    no_spark: Annotated[bool, typer.Option(
        "--no-spark", help="Check structure, references, columns, types and event time "
        "from the declared schemas only; skip the expression check with Spark's analyzer "
        "(no Java needed, under a second).")] = False,
) -> None:
    """Check pipeline files: keys, types, references, cycles, columns and event time (without
    Spark, for every file first), then every expression against its input schema (Spark's
    analyzer). Prints `file:line:col: message` per problem; exit code 1 if any.
    """
    from streamer.cli.errors import print_error
    from streamer.pipeline.continuous_support import check_mode
    from streamer.pipeline.exceptions import PipelineError
    from streamer.pipeline.validate import load_pipeline

    out = stdout_console()  # (a path is never wrapped)
    failed = 0
    # First what needs no Spark, for every file (its errors print at once); then Spark's
    # analyzer, once, for the expressions of the files that passed.
    from streamer.runtime.job.checks import check_user_code

    loaded = []
    for file in files:
        try:
            spec = load_pipeline(str(file))
            check_user_code(spec)
            check_mode(spec, spec.job.execution.with_overrides(os.environ))
            loaded.append((file, spec))
        except PipelineError as exc:
            print_error(exc)
            failed += 1
        except StreamerError as exc:
            err_console().print(f"[red]error[/red] {file}: {exc}")
            failed += 1
    spark = None
    if loaded and not no_spark:
        from streamer.runtime.job.checks import analysis_session, analyze_spec

        err_console().print(f"checking expressions with Spark's analyzer ({len(loaded)} "
                            f"file{'s' if len(loaded) != 1 else ''}; --no-spark skips this)")
        spark = analysis_session(loaded[0][1])  # one session for every file
    for file, spec in loaded:
        if spark is not None:
            try:
                analyze_spec(spec, spark)
            except PipelineError as exc:
                print_error(exc)
                failed += 1
                continue
            except StreamerError as exc:
                err_console().print(f"[red]error[/red] {file}: {exc}")
                failed += 1
                continue
        out.print(f"[green]ok[/green] {file}")
    if failed:
        raise typer.Exit(1)


@app.command()
@boundary
def plan(
    file: FileArg,
    format: Annotated[PlanFormat, typer.Option(
        "--format", "-f", help="tree (default), mermaid, dot or json; with --physical, tree "
        "or json.")] = PlanFormat.tree,
    physical: Annotated[bool, typer.Option(
        "--physical", help="Show the physical plan instead: the stages (source reads, "
        "stateless chains, keyed stages, sinks), the strategy of each and why, and the "
        "per-epoch rule. Starts Spark locally to read the sources' schemas; writes "
        "nothing.")] = False,
) -> None:
    """Show the logical dataflow: operators, uids, key_by, parallelism, and where rows are
    shuffled by key group (no Spark needed); or, with --physical, how each stage runs.
    """
    from streamer.pipeline.graph import compile_dataflow
    from streamer.pipeline.validate import load_pipeline

    spec = load_pipeline(str(file))
    if physical:
        if format not in (PlanFormat.tree, PlanFormat.json):
            err_console().print(f"[red]error[/red] --physical prints tree or json, not "
                                f"{format.value}")
            raise typer.Exit(2)
        from streamer.runtime.job.checks import physical_plan
        from streamer.runtime.plan.physical import render

        found = physical_plan(spec)
        if format is PlanFormat.json:
            typer.echo(json.dumps(found.to_json(), indent=2))
        else:
            typer.echo(render(found), nl=False)
        return
    flow = compile_dataflow(spec)
    if format is PlanFormat.json:
        typer.echo(json.dumps(flow.to_json(), indent=2))
    elif format is PlanFormat.mermaid:
        typer.echo(flow.to_mermaid(), nl=False)
    elif format is PlanFormat.dot:
        typer.echo(flow.to_dot(), nl=False)
    else:
        from streamer.cli.render import plan_tree

        Console(highlight=False).print(plan_tree(flow))


@app.command()
@boundary
def run(
    file: FileArg,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")
                     ] = False,
    json_lines: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object per line (started, epoch metrics, finished) "
        "instead of the live display.")] = False,
    master: Annotated[str | None, typer.Option(
        help="Spark master URL (default local[*], Spark inside this process).")] = None,
    conf: Annotated[list[str] | None, typer.Option(
        "--conf", help="Extra Spark setting KEY=VALUE (repeatable); overrides the file's "
        "spark: block.")] = None,
    max_epochs: Annotated[int | None, typer.Option(
        help="Stop after this many epochs that read data (smoke runs).", min=1)] = None,
    no_ui: Annotated[bool, typer.Option("--no-ui", help="Do not start Spark's web UI.")
                     ] = False,
    from_checkpoint: Annotated[str | None, typer.Option(
        "--from-checkpoint", help="Resume from this checkpoint (its number, or its chk-<n> "
        "path) instead of the latest.")] = None,
    fresh: Annotated[bool, typer.Option(
        "--fresh", help="Delete the job's checkpoints and start from the sources' beginning "
        "with empty state.")] = False,
    no_checkpoints: Annotated[bool, typer.Option(
        "--no-checkpoints", help="Take no checkpoints and resume from none (sinks commit "
        "every epoch; a failure is not recovered).")] = False,
    storage: Annotated[str | None, typer.Option(
        help="Storage URL for checkpoints (default: the file's storage:, "
        "$STREAMER_STORAGE, ./.streamer).")] = None,
    from_savepoint: Annotated[str | None, typer.Option(
        "--from-savepoint", help="Start from this savepoint directory (same as "
        "`streamer restore`).")] = None,
    allow_non_restored_state: Annotated[bool, typer.Option(
        "--allow-non-restored-state", help="With --from-savepoint: drop state whose operator "
        "uid is no longer in the pipeline instead of refusing.")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", min=1, max=65535, help="Serve Prometheus metrics on this port "
        "(127.0.0.1 unless job.metrics.prometheus.host says otherwise) while the job runs; "
        "overrides job.metrics.prometheus.port. See docs/metrics.md.")] = None,
    submit: Annotated[bool, typer.Option(
        "--submit", help="Launch the job with spark-submit on the cluster of --master "
        "(spark://HOST:PORT): streamer, the pipeline and its modules are shipped, and this "
        "runtime runs as the Spark driver here (client deploy mode).")] = False,
    deploy_mode: Annotated[str, typer.Option(
        "--deploy-mode", help="With --submit: client (default). cluster is refused: Spark "
        "standalone does not run Python applications in cluster mode.")] = "client",
    executor_memory: Annotated[str | None, typer.Option(
        "--executor-memory", help="With --submit: memory per executor, e.g. 2g.")] = None,
    num_executors: Annotated[int | None, typer.Option(
        "--num-executors", min=1, help="With --submit: number of executors (YARN and "
        "Kubernetes; on standalone use --spark-arg=--total-executor-cores=N).")] = None,
    python_env: Annotated[str | None, typer.Option(
        "--python-env", help="With --submit: a packed Python environment (venv-pack or "
        "conda-pack tar.gz with streamer's dependencies) for the executors; default: they "
        "run this interpreter.")] = None,
    spark_arg: Annotated[list[str] | None, typer.Option(
        "--spark-arg", help="With --submit: one more spark-submit argument, passed as is "
        "(repeatable; e.g. --spark-arg=--total-executor-cores=2). Arguments after `--` are "
        "passed too.")] = None,
    extra: Annotated[list[str] | None, typer.Argument(
        help="After `--`: spark-submit arguments (with --submit).", show_default=False)
    ] = None,
) -> None:
    """Run a pipeline. Bounded sources end the job (exit 0); unbounded ones run until Ctrl-C,
    which stops cleanly at the next epoch boundary (after a final checkpoint).

    A job that has completed checkpoints resumes from the latest one: its sources continue
    from the checkpoint's offsets, its keyed state and watermark are restored, and output the
    checkpoint covered is committed (again, idempotently) — so a killed run is finished by
    running the same command again.
    """
    from streamer.pipeline.validate import load_pipeline

    spark_args = [*(spark_arg or []), *(extra or [])]
    submit_only = {"--deploy-mode": deploy_mode != "client", "--executor-memory":
                   executor_memory, "--num-executors": num_executors,
                   "--python-env": python_env, "--spark-arg / --": spark_args}
    if not submit and any(submit_only.values()):
        from streamer.exceptions import ConfigError

        given = ", ".join(k for k, v in submit_only.items() if v)
        msg = f"{given} only apply with --submit (launching the job through spark-submit)"
        raise ConfigError(msg)
    spec = load_pipeline(str(file))
    if submit:
        from streamer.runtime.cluster.submit import SubmitOptions, submit_job

        args = _run_args(quiet=quiet, json_lines=json_lines, conf=conf, max_epochs=max_epochs,
                         no_ui=no_ui, from_checkpoint=from_checkpoint, fresh=fresh,
                         no_checkpoints=no_checkpoints, storage=storage,
                         from_savepoint=from_savepoint,
                         allow_non_restored_state=allow_non_restored_state,
                         metrics_port=metrics_port)
        options = SubmitOptions(master=master or "", deploy_mode=deploy_mode,
                                conf=parse_conf(conf), executor_memory=executor_memory,
                                num_executors=num_executors, python_env=python_env,
                                spark_args=spark_args)
        code = submit_job(spec, file, args, options, debug=state["debug"])
        if code:
            raise typer.Exit(code)
        return
    run_job(spec, quiet=quiet, json_lines=json_lines, master=master, conf=conf,
            max_epochs=max_epochs, no_ui=no_ui, from_checkpoint=from_checkpoint, fresh=fresh,
            no_checkpoints=no_checkpoints, storage=storage, from_savepoint=from_savepoint,
            allow_non_restored_state=allow_non_restored_state, metrics_port=metrics_port)


def _run_args(*, quiet: bool, json_lines: bool, conf: list[str] | None,
              max_epochs: int | None, no_ui: bool, from_checkpoint: str | None, fresh: bool,
              no_checkpoints: bool, storage: str | None, from_savepoint: str | None,
              allow_non_restored_state: bool, metrics_port: int | None = None) -> list[str]:
    """The `streamer run` options the driver of a submitted job runs with (paths absolute:
    the driver may not share the working directory's meaning)."""
    args = [flag for flag, on in (("--quiet", quiet), ("--json", json_lines), ("--no-ui", no_ui),
                                  ("--fresh", fresh), ("--no-checkpoints", no_checkpoints),
                                  ("--allow-non-restored-state", allow_non_restored_state))
            if on]
    for item in conf or []:
        args += ["--conf", item]
    if max_epochs is not None:
        args += ["--max-epochs", str(max_epochs)]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port)]
    if from_checkpoint is not None:
        args += ["--from-checkpoint", from_checkpoint]
    if storage is not None:
        args += ["--storage", storage if "://" in storage else str(Path(storage).resolve())]
    if from_savepoint is not None:
        args += ["--from-savepoint", from_savepoint if "://" in from_savepoint
                 else str(Path(from_savepoint).resolve())]
    return args


@app.command("test")
@boundary
def test_cmd(
    file: FileArg,
    case: Annotated[list[str] | None, typer.Option(
        "--case", "-k", help="Run only the test cases with this name (repeatable).")] = None,
) -> None:
    """Run the pipeline's `tests:` cases: inline rows replace the named sources, and each
    expected sink's rows are compared (order-insensitive) with a diff. Exit 1 on mismatch.
    """
    from streamer.cli.render import print_case_result
    from streamer.pipeline.validate import load_pipeline
    from streamer.runtime.exceptions import PipelineTestFailedError
    from streamer.runtime.job.checks import shared_session
    from streamer.runtime.job.testing import run_case

    spec = load_pipeline(str(file))
    cases = [c for c in spec.tests if not case or c.name in case]
    if not cases:
        from streamer.exceptions import ConfigError

        what = f"named {', '.join(map(repr, case))} " if case else ""
        msg = (
            f"{file} has no tests {what}to run; add a tests: block (see "
                          "docs/guide/testing.md) or check --case"
        )
        raise ConfigError(msg)
    from streamer.cli.launch import warn
    from streamer.runtime.job.preflight import PreflightOptions, preflight

    replaced = frozenset.intersection(*(frozenset(c.inputs) for c in cases))
    preflight(spec, PreflightOptions(checkpoints=False, replaced=replaced, sinks=False), warn)
    spark = shared_session(spec)
    console = Console(highlight=False)
    failed = 0
    for c in cases:
        result = run_case(spec, c, spark)
        print_case_result(console, result)
        failed += not result.passed
    console.print(f"{len(cases) - failed} passed, {failed} failed")
    if failed:
        msg = f"{failed} of {len(cases)} test cases of {file} failed"
        raise PipelineTestFailedError(msg)


@app.command()
@boundary
def init(
    name: Annotated[str, typer.Argument(help="The job's name (lowercase letters, digits, "
                                        "dashes), also the new folder's.", show_default=False)],
    directory: Annotated[Path, typer.Option(
        "--dir", help="Where to create the folder NAME (default: here).")] = Path("."),
) -> None:
    """Start a pipeline project: NAME/pipeline.yaml (a filter and a window over generated
    events, with a tests: block), a README, a CI workflow running `streamer validate` and
    `streamer test`, requirements.txt and .gitignore. Existing files are never overwritten.
    """
    from streamer.pipeline.scaffold import scaffold

    created = scaffold(name, directory, __version__)
    out = stdout_console()  # (a path is never wrapped)
    for path in created:
        out.print(f"[green]created[/green] {path}")
    root = directory / name
    out.print(f"next: cd {root} && streamer validate pipeline.yaml && streamer test "
              "pipeline.yaml", soft_wrap=True)


@app.command()
@boundary
def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file "
                                                "instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of the pipeline file, for editor completion and checks (e.g.
    `# yaml-language-server: $schema=streamer.schema.json`).
    """
    from streamer.pipeline.schema import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if output:
        output.write_text(text, encoding="utf-8")
        err_console().print(f"wrote {output}")
    else:
        sys.stdout.write(text)


from streamer.cli.checkpoints import checkpoint_app  # noqa: E402 - after the app exists
from streamer.cli.jobs import register_job_commands  # noqa: E402
from streamer.cli.savepoints import savepoint_app  # noqa: E402

app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(savepoint_app, name="savepoint")
register_job_commands(app)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="streamer")


if __name__ == "__main__":
    main()
