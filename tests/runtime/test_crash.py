"""Exactly-once recovery under SIGKILL, end to end through the CLI.

One bounded job (datagen -> event-time tumbling windows at parallelism 2 -> files, a
checkpoint every epoch) is started with `streamer run` and killed with SIGKILL, every one of
its processes at once as in a machine crash, then started again, until a run finishes. The
kills land at fail points (`failpoints.py`: at the start of an epoch, inside a keyed
task, in the middle of a snapshot upload, after the snapshots, between `_metadata` and the sink
commit, right after a sink commit) and at random moments after a few of the run's JSON events.
The committed output must then equal an uninterrupted run's row for row (nothing lost, nothing
duplicated), with nothing staged left behind. Both state backends run the same schedule shape:
rocksdb writes jsonl (Spark writes the sink's files), memory parquet (the keyed tasks write
them, `connectors/files_sink.TaskFile`), whose reference run has Spark write them.

Kills per backend: `STREAMER_TEST_CRASH_KILLS` (default 8, so 16 in all: every fail point once and
two random kills per backend; raise it for longer local runs). A lap runs the job from scratch
to its end with at most one kill per epoch on average; laps follow each other until the kills
are all done. The kills are chosen by a seeded RNG: `STREAMER_TEST_CRASH_SEED` repeats the same
choices (the moment of a random kill still depends on how fast epochs run). The seed and every
run are printed, and repeated in every failure message.

A new JVM costs a run about 6.5 s to its SparkSession and more to its first job (cold JIT), so
a campaign (`LapJob.warm`) runs on one warm JVM (`warm_jvm.py`, started with what the lap's
pipeline needs at JVM start: the quick driver options, its connectors' packages such as
S3A's): a kill there kills the run's driver and the JVM's Python workers, and the
next driver stops what the dead one left in the JVM before it starts. The campaign's first
kill and its random kills kill the JVM too, as a machine crash does (`Campaign.machine_crash`).
The reference run (one, writing both formats, shared with test_s3_jobs.py) and the two
backends' campaigns run side by side. The campaigns of other sinks and jobs
(test_*_crash.py) use this module's harness: `crash_campaign` with a `LapJob`, its epochs
and the kinds of kill it deals.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fragments import crash_job, files_sink, section, write_pipeline
from streamer_process import FilesOutput, Run, diff, quick_jvm, run_streamer
from warm_jvm import WarmJvm, run_warm

from streamer.checkpoint.checkpoint_metadata import CheckpointStore

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLS = int(os.environ.get("STREAMER_TEST_CRASH_KILLS", "8"))
SEED = int(os.environ.get("STREAMER_TEST_CRASH_SEED") or random.SystemRandom().randrange(2**32))
JOB = "crash"
#: records per split, and per epoch over both splits: 10 epochs of data, the last one final
LIMIT, PER_EPOCH = 600, 120


def pipeline(root: Path | str, backend: str, sinks: str, *, name: str = JOB,
             **options: Any) -> str:
    """The campaign's job in `root` (`fragments.crash_job`: the datagen clicks through the
    windows `per_window`) into `sinks`, with the quick driver JVM. The campaigns into other
    sinks name it after themselves; `options` go to `crash_job` (test_s3_jobs.py changes
    its storage and more)."""
    return (crash_job(name, root, backend=backend, limit=LIMIT, per_epoch=PER_EPOCH, **options)
            + section("sinks", sinks) + quick_jvm())


def write_job(root: Path, backend: str, fmt: str = "jsonl") -> Path:
    """The pipeline file of the job in `root` (its storage, state and output there too)."""
    return write_pipeline(root, pipeline(root, backend, files_sink("per_window", root / "out",
                                                                   fmt)))


BACKENDS = ("rocksdb", "memory")
#: The sink format of each backend's campaign: parquet output is written by the keyed tasks.
FORMATS = {"rocksdb": "jsonl", "memory": "parquet"}
#: Epochs of the job: its data; the last of them also ends the input (every window fires, and
#: the final checkpoint is taken), as no empty epoch follows the last records.
EPOCHS = 2 * LIMIT // PER_EPOCH


def reference_pipeline(root: Path) -> str:
    """The reference job: the windows into a jsonl and a parquet files sink, both written by
    Spark."""
    return pipeline(root, "rocksdb", "".join(
        files_sink("per_window", root / f"out-{fmt}", fmt, id=f"out_{fmt}")
        for fmt in ("jsonl", "parquet")))


_references: dict[str, Counter[str]] = {}
_references_lock = threading.Lock()


def reference_outputs(root: Path) -> dict[str, Counter[str]]:
    """What one uninterrupted `streamer run --no-checkpoints` of the job commits, per format
    (Spark writing the files, also in parquet). One run in `root` writes both formats, once
    per test session: the campaigns of this module and of test_s3_jobs.py share it."""
    with _references_lock:
        if not _references:
            path = write_pipeline(root, reference_pipeline(root))
            reference_run(path, EPOCHS, env={"STREAMER_TASK_SINK": "0"})
            rows = {f: FilesOutput(root / f"out-{f}", f).committed() for f in FORMATS.values()}
            assert rows["jsonl"] and sum(rows["parquet"].values()) == sum(
                rows["jsonl"].values()) > 100
            _references.update(rows)
    return _references


def reference_output(root: Path, fmt: str = "jsonl") -> Counter[str]:
    """The reference output in `fmt` (`reference_outputs`)."""
    return reference_outputs(root)[fmt]


# ------------------------------------------------------------------------------ kill plans
#: Fail point -> what its number counts, and how many checkpoints complete before it fires
#: when armed for the run's first epoch or checkpoint.
POINTS = {"epoch-start": ("epoch", 0), "staged": ("epoch", 0), "arrow-written": ("epoch", 0),
          "in-task": ("epoch", 0),
          "mid-upload": ("chk", 0), "after-snapshot": ("chk", 0), "after-metadata": ("chk", 1),
          "mid-commit": ("chk", 1)}
#: The kinds of kill a campaign deals from its deck by default: every fail point every job
#: reaches (`staged` only fires where a keyed stage's input is staged, `arrow-written` where
#: Arrow tasks write a sink) once, random kills twice.
KINDS = ("epoch-start", "in-task", "mid-upload", "after-snapshot", "after-metadata",
         "mid-commit", "random", "random")
#: The kinds that put a sink's two-phase commit at risk, for the campaigns of other sinks on
#: this module's job (whose keyed stage this module's campaign covers with every kind): the
#: epoch's output written but not staged (in-task), staged but no `_metadata`
#: (after-snapshot), `_metadata` but not committed (after-metadata), one sink committed but not
#: the next (mid-commit), and anywhere.
SINK_KINDS = ("in-task", "after-snapshot", "after-metadata", "mid-commit", "random", "random")


@dataclass
class Kill:
    """Where one run is to die: at fail point `point` armed for `number`, or (`point` ==
    "random") `delay` seconds after the run's `number`-th completed checkpoint (0: after its
    `started` event), or at once should another checkpoint complete first."""

    point: str
    number: int
    delay: float = 0.0
    #: The epoch the run resumed from, and how the run ended (filled in afterwards).
    resumed_at: int = 0
    outcome: str = ""

    def __str__(self) -> str:
        what = (f"random {self.delay:.2f}s after checkpoint #{self.number} of the run"
                if self.point == "random" else f"{self.point}:{self.number}")
        return f"{what} (resumed at epoch {self.resumed_at}) -> {self.outcome}"

    def env(self) -> dict[str, str]:
        """The run's fail points."""
        return {} if self.point == "random" else {
            "STREAMER_TEST_FAILPOINTS": f"{self.point}:{self.number}"}


class RandomCrash:
    """The test's own kill: `delay` seconds after the `after`-th completed checkpoint (0: the
    `started` event), or at once when the checkpoint after that completes."""

    def __init__(self, after: int, delay: float) -> None:
        self.after, self.delay = after, delay
        self.seen = 0
        self.armed_at: float | None = None

    def __call__(self, event: dict[str, Any] | None, elapsed: float) -> bool:
        if event is not None:
            if event.get("event") == "started" and self.after == 0:
                self.armed_at = elapsed
            if event.get("event") == "checkpoint" and event.get("status") == "completed":
                self.seen += 1
                if self.seen == self.after:
                    self.armed_at = elapsed
                elif self.seen > self.after:
                    return True
        return self.armed_at is not None and elapsed >= self.armed_at + self.delay


@dataclass
class Timing:
    """How long the first epoch of a run takes (a restore included) and its later ones, in
    seconds, as measured so far: random kills are drawn within them."""

    first: list[float] = field(default_factory=lambda: [8.0])
    later: list[float] = field(default_factory=lambda: [2.5])

    def learn(self, run: Run) -> None:
        """Add the durations of the run's epochs."""
        seconds = [e["duration_ms"] / 1000 for e in run.events if e.get("event") == "epoch"]
        self.first += seconds[:1]
        self.later += seconds[1:]

    def window(self, after: int) -> float:
        """How long the epoch that follows the `after`-th checkpoint of a run takes."""
        return statistics.median(self.first if after == 0 else self.later)


class Planner:
    """Chooses the kills of a campaign of a job of `epochs` epochs. The kinds come from a
    shuffled deck (`kinds`: by default every fail point once, random kills twice) in its
    order, so a campaign's first `len(kinds)` kills cover every kind; each kill lets about
    `remaining epochs / kills left` epochs complete, so the kills spread over the whole job
    (its final epoch and checkpoint included), and the job never finishes while kills are
    still due."""

    def __init__(self, rng: random.Random, epochs: int = EPOCHS,
                 kinds: tuple[str, ...] = KINDS) -> None:
        self.rng = rng
        self.epochs = epochs
        self.kinds = kinds
        self.deck: list[str] = []
        #: The epochs of runs that start a JVM (False) and of runs on a warm one (True), whose
        #: first epochs take a fraction of the time.
        self.timings = {False: Timing(), True: Timing()}

    def next(self, remaining: int, kills_left: int, resumed_at: int, next_id: int,
             warm: bool = False) -> Kill:
        """The kill of a run that resumes after epoch `resumed_at` with `remaining` epochs to
        go, when checkpoint ids start at `next_id` (on a `warm` JVM)."""
        rng = self.rng
        cap = remaining - 1 if kills_left > 1 else remaining  # epochs it may let complete
        target = remaining / kills_left
        progress = max(0, min(cap, int(target) + (rng.random() < target - int(target))))
        if not self.deck:
            self.deck = self.shuffled()
        # The first kind of the deck that fits (else of a spare deck: with one epoch left and
        # more kills due, only a kill that lets no checkpoint complete will do).
        for index, kind in enumerate([*self.deck, *self.shuffled()]):
            if kind == "random":
                if cap < 1:  # it may let one more checkpoint complete than it waits for
                    continue
                after = max(0, min(progress, cap - 1) - rng.randint(0, 1))
                delay = rng.uniform(0.0, self.timings[warm].window(after))
                kill = Kill(kind, after, delay, resumed_at)
            else:
                counts, base = POINTS[kind]
                # A base-0 point fires in epoch `resumed_at + 1 + done`, which must exist (the
                # last kill of a lap, which may let every epoch complete, fires it in the final
                # one); a base-1 point once its checkpoint (one more epoch) is complete.
                done = min(max(progress, base), cap, self.epochs - resumed_at - 1 + base) - base
                if done < 0:
                    continue
                first = resumed_at + 1 if counts == "epoch" else next_id
                kill = Kill(kind, first + done, resumed_at=resumed_at)
            if index < len(self.deck):
                del self.deck[index]
            return kill
        msg = f"no kill fits: {remaining} epochs to go, {kills_left} kills due"
        raise AssertionError(msg)

    def shuffled(self) -> list[str]:
        """A new deck."""
        deck = list(self.kinds)
        self.rng.shuffle(deck)
        return deck


# ------------------------------------------------------------------------------ the runs
@dataclass
class Lap:
    """The job run to completion from scratch in `root`, with its kills and what it
    committed."""

    root: Path
    kills: list[Kill] = field(default_factory=list)
    runs: int = 0
    rows: Counter[str] = field(default_factory=Counter)
    leftovers: list[str] = field(default_factory=list)
    #: The epoch of the newest complete checkpoint at the end (all of them: a rerun is a no-op).
    final_epoch: int | None = None


@dataclass
class Campaign:
    """Every lap of one backend, and the log of its runs."""

    backend: str
    laps: list[Lap] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    #: The JVM its runs share (`LapJob.warm`).
    jvm: WarmJvm | None = None

    def machine_crash(self, kill: Kill) -> bool:
        """Whether `kill` is to kill the JVM too, as a machine crash does. Every kill of a
        campaign without a warm JVM; with one, the campaign's first kill and its random
        ones: a fail point kills the driver at a known step (a keyed task's: the JVM's
        Python workers die with it), a random kill at any moment of the JVM's own work
        (a Spark writer's task, a commit), which a crash of the JVM cuts short where a
        stop would cancel it cleanly."""
        return self.jvm is None or not self.kills or kill.point == "random"

    def run(self, pipeline: Path, kill: Kill | None, watch: RandomCrash | None,
            stderr_file: Path) -> tuple[Run, str]:
        """Run `pipeline` once, with `kill`'s fail points and `watch`, on the warm JVM if the
        campaign has one (killed with the run when the kill is a `machine_crash`); return
        the run and a note on its JVM for the log."""
        jvm = self.jvm
        env = kill.env() if kill else {}
        if jvm is None:
            return run_streamer(pipeline, env=env, watch=watch, stderr_file=stderr_file), ""
        machine = kill is not None and self.machine_crash(kill)
        starts, workers = jvm.starts, jvm.workers_killed
        run = run_warm(jvm, pipeline, env=env, watch=watch, stderr_file=stderr_file,
                       machine_crash=machine)
        fresh = f"new JVM started in {jvm.start_seconds:.1f}s" if jvm.starts > starts \
            else "warm JVM"
        killed = "killed too" if machine else \
            f"{jvm.workers_killed - workers} Python processes of it killed"
        return run, f" ({fresh}, {killed})"

    @property
    def kills(self) -> list[Kill]:
        """Every kill of every lap."""
        return [kill for lap in self.laps for kill in lap.kills]

    def note(self, line: str) -> None:
        self.log.append(f"{self.backend} {line}")
        print(self.log[-1], flush=True)

    @property
    def schedule(self) -> str:
        """The seed and every run, for failure messages."""
        return "\n".join([f"seed {SEED} (STREAMER_TEST_CRASH_SEED={SEED} repeats the choices)",
                          *self.log])


@dataclass(frozen=True)
class LapJob:
    """What a crash campaign runs: the job's name (whose checkpoints a lap resumes from), and
    per lap directory, how to write the pipeline file and how to read what the finished lap
    committed (into `Lap.rows` and `Lap.leftovers`). test_kafka_crash.py runs its own."""

    name: str
    write: Callable[[Path], Path]
    collect: Callable[[Path, Lap], None]
    #: The storage URL of the lap in a directory (test_s3_jobs.py: a prefix on S3).
    storage: Callable[[Path], str] = lambda root: str(root / "storage")
    #: The job's epochs (its final one included), and the kinds of kill its campaign deals.
    epochs: int = EPOCHS
    kinds: tuple[str, ...] = KINDS
    #: Whether the campaign's runs share a warm JVM (`warm_jvm.py`) between the kills that
    #: model a machine crash, started with what the job needs at JVM start (the quick
    #: driver options, the packages of its connectors: `WarmJvm.configure`).
    warm: bool = False


def collect_files(fmt: str = "jsonl") -> Callable[[Path, Lap], None]:
    """A `LapJob.collect` of a job whose one files sink writes `fmt` files to `<root>/out`."""

    def collect(root: Path, lap: Lap) -> None:
        output = FilesOutput(root / "out", fmt)
        lap.rows, lap.leftovers = output.committed(), output.leftovers()

    return collect


def alternating_backends(write_job: Callable[[Path, str], Path]) -> Callable[[Path], Path]:
    """A `LapJob.write` that writes lap n's job (in `<label>-<n>`) on `BACKENDS[(n - 1) % 2]`."""

    def write(root: Path) -> Path:
        lap = int(root.name.rpartition("-")[2])
        return write_job(root, BACKENDS[(lap - 1) % len(BACKENDS)])

    return write


def epochs_that(root: Path, wrong: Callable[[dict[str, Any]], bool]) -> list[str]:
    """The epochs of the runs in `root` (their `--json` events) that are `wrong`."""
    found = []
    for events in sorted(root.glob("*.jsonl")):
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "epoch" and wrong(event):
                found.append(f"{events.name}: epoch {event['epoch']} ran {event}")
    return found


def files_job(backend: str, fmt: str = "jsonl") -> LapJob:
    """This module's datagen -> windows -> files job on `backend`, writing `fmt` files."""
    return LapJob(JOB, lambda root: write_job(root, backend, fmt), collect_files(fmt),
                  warm=True)


def run_lap(campaign: Campaign, root: Path, kills_wanted: int, planner: Planner,
            job: LapJob) -> Lap:
    """Run the job in `root`, killing it up to `kills_wanted` times, until a run finishes."""
    lap = Lap(root)
    campaign.laps.append(lap)
    pipeline = job.write(root)
    if campaign.jvm is not None:  # (before `warm` is read: a new JVM-start setting closes it)
        campaign.jvm.configure(pipeline)
    store = CheckpointStore(job.storage(root), job.name)
    while True:
        latest = store.latest()
        resumed_at = latest.epoch if latest else 0
        kills_left = kills_wanted - len(lap.kills)
        kill = None
        warm = campaign.jvm is not None and campaign.jvm.sid is not None
        if kills_left > 0 and resumed_at < job.epochs:
            kill = planner.next(job.epochs - resumed_at, kills_left, resumed_at,
                                store.next_id(), warm)
        watch = RandomCrash(kill.number, kill.delay) if kill and kill.point == "random" \
            else None
        run, jvm_note = campaign.run(pipeline, kill, watch, root / f"run-{lap.runs}.stderr")
        lap.runs += 1
        planner.timings[warm].learn(run)
        done = [e["id"] for e in run.checkpoints("completed")]
        failed = [e["id"] for e in run.checkpoints("failed")]
        outcome = (f"{'killed' if run.killed else f'exit {run.returncode}'} after "
                   f"{run.seconds:.1f}s, checkpoints completed {done}"
                   + (f", failed {failed}" if failed else "") + jvm_note)
        if kill is not None:
            kill.outcome = outcome
            campaign.note(f"{root.name} kill {len(lap.kills) + 1}: {kill}")
        else:
            campaign.note(f"{root.name} last run: {outcome}")
        if run.killed:
            assert kill is not None, f"an unplanned SIGKILL\n{run.describe()}"
            lap.kills.append(kill)
            continue
        assert run.returncode == 0 and run.finished is not None \
            and run.finished["status"] == "finished", \
            f"the run after kill {len(lap.kills)} failed: {run.describe()}"
        job.collect(root, lap)
        final = store.latest()
        lap.final_epoch = final.epoch if final else None
        return lap


def crash_campaign(label: str, root: Path, job: LapJob, kills: int = KILLS,
                   per_lap: int | None = None) -> Campaign:
    """Laps of `job` (log and seed named `label`) until `kills` kills are done, at most
    `per_lap` in a lap (by default one per epoch of the job)."""
    campaign = Campaign(label, jvm=WarmJvm(root / "jvm") if job.warm else None)
    planner = Planner(random.Random(f"{SEED}-{label}"), job.epochs, job.kinds)
    per_lap = min(per_lap or job.epochs, job.epochs)
    try:
        while len(campaign.kills) < kills:
            assert len(campaign.laps) < 2 * kills, "the kills do not take effect"
            run_lap(campaign, root / f"lap-{len(campaign.laps) + 1}",
                    min(kills - len(campaign.kills), per_lap), planner, job)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{campaign.schedule}") from exc
    finally:
        if campaign.jvm is not None:
            campaign.note(f"JVM starts: {campaign.jvm.starts}")
            campaign.jvm.close()
    return campaign


def check_campaign(campaign: Campaign, reference: Counter[str], kills: int,
                   epochs: int = EPOCHS, kinds: tuple[str, ...] = ()) -> None:
    """Every lap committed exactly `reference`, left nothing staged and ended with the
    checkpoint of its final epoch (`epochs`); `kills` kills were done, of every kind in
    `kinds` among them when there were as many as kinds. Failures name the seed and every
    run."""
    for lap in campaign.laps:
        assert lap.rows == reference, f"{diff(lap.rows, reference)}\n{campaign.schedule}"
        assert lap.leftovers == [], f"{lap.root.name}: {lap.leftovers}\n{campaign.schedule}"
        assert lap.final_epoch == epochs, campaign.schedule
    points = Counter(kill.point for kill in campaign.kills)
    print(f"{campaign.backend}: {len(campaign.kills)} kills in {len(campaign.laps)} lap(s): "
          f"{dict(sorted(points.items()))}")
    assert len(campaign.kills) >= kills, campaign.schedule
    missing = set(kinds) - set(points) if kills >= len(kinds) else set()
    assert not missing, f"kinds not dealt: {missing}\n{campaign.schedule}"


def reference_run(path: Path, epochs: int, *args: str, **kwargs: Any) -> Run:
    """One uninterrupted `streamer run --no-checkpoints` of the pipeline file `path` (more
    `args` and `run_streamer` options as given), which must finish after `epochs` epochs."""
    run = run_streamer(path, "--no-checkpoints", *args, **kwargs)
    assert run.returncode == 0 and run.finished, run.describe()
    assert run.finished["epochs"] == epochs, run.finished
    return run


def checked_campaign(label: str, tmp_path: Path, reference: Callable[[Path], Counter[str]],
                     job: LapJob, kills: int, per_lap: int | None = None) -> Campaign:
    """A campaign's reference output (`reference` of `<tmp_path>/reference`) and its kill
    campaign (`crash_campaign` in `<tmp_path>/<label>`), run side by side (each pays its JVM
    starts, and together they share the machine better than one after another), then checked
    against each other (`check_campaign`, with the job's epochs and kinds of kill)."""
    print(f"{label} crash test seed {SEED} (STREAMER_TEST_CRASH_SEED), {kills} kills in "
          f"{tmp_path}")
    with ThreadPoolExecutor(max_workers=2) as pool:
        reference_f = pool.submit(reference, tmp_path / "reference")
        campaign_f = pool.submit(crash_campaign, label, tmp_path / label, job, kills, per_lap)
        campaign = campaign_f.result()
        check_campaign(campaign, reference_f.result(), kills, job.epochs, kinds=job.kinds)
    return campaign


@pytest.fixture(scope="module")
def campaigns(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Future[dict[str, Counter[str]]], dict[str, Future[Campaign]]]:
    """The reference run (both sink formats) and the kill campaigns of the backends the
    selected tests need, run side by side (each run pays seconds of JVM start; together they
    share the machine better than one after another)."""
    selected = {getattr(item, "callspec", None) and item.callspec.params.get("backend")
                for item in request.session.items
                if getattr(item, "module", None) is request.module}
    backends = [backend for backend in BACKENDS if backend in selected]
    root = tmp_path_factory.mktemp("crash")
    print(f"crash test seed {SEED} (STREAMER_TEST_CRASH_SEED), {KILLS} kills per backend in {root}")
    with ThreadPoolExecutor(max_workers=1 + len(backends)) as pool:
        references = pool.submit(reference_outputs, root / "reference")
        runs = {backend: pool.submit(crash_campaign, backend, root / backend,
                                     files_job(backend, FORMATS[backend]))
                for backend in backends}
    return references, runs


# ------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkill_at_any_moment_then_restart_commits_exactly_the_reference_output(
        campaigns: tuple[Future[dict[str, Counter[str]]], dict[str, Future[Campaign]]],
        backend: str) -> None:
    reference = campaigns[0].result()[FORMATS[backend]]
    check_campaign(campaigns[1][backend].result(), reference, KILLS,
                   kinds=KINDS)
