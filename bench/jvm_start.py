"""What a driver's start costs with streamer's class archive (runtime/cluster/jvm_archive.py)
against Spark's own start, which Spark Structured Streaming pays too (the JDK's default class
sharing only): a fresh Python process each time, to a SparkSession and to its first finished
job, alternating the two.

    .venv/bin/python -m bench.jvm_start [--repeat 5] [--master local[2]]

Prints the median wall seconds to the session and to the first job, and the median CPU
seconds of the driver's process tree (Python, spark-submit's launcher and the JVM) at the
first job, and the machine's load average before and after. The archive must exist (any
earlier `streamer run` on this machine saves it); the bench says so if it does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

#: One sample: a driver's start and first job, as JSON on stdout.
SAMPLE = textwrap.dedent("""\
    import json, os, sys, time
    began = time.perf_counter()
    from streamer.runtime.cluster.spark import DEFAULT_CONF, create_session
    key = "spark.driver.extraJavaOptions"
    conf = {} if sys.argv[1] == "archive" else {key: DEFAULT_CONF[key] + " -Xshare:auto"}
    spark = create_session("bench", master=sys.argv[2], ui=False, conf=conf)
    session = time.perf_counter() - began
    spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
    job = time.perf_counter() - began
    me, hz, kids = os.getpid(), os.sysconf("SC_CLK_TCK"), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        kids[int(pid)] = (int(rest[1]), int(rest[11]) + int(rest[12]) + int(rest[13])
                          + int(rest[14]))
    def mine(pid):
        while pid in kids and pid > 1:
            if pid == me:
                return True
            pid = kids[pid][0]
        return False
    ticks = sum(kids[p][1] for p in kids if mine(p))  # (with reaped children: the launcher)
    print(json.dumps({"session": session, "job": job, "cpu": ticks / hz}))
    """)


def sample(mode: str, master: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", SAMPLE, mode, master], capture_output=True,
                          text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per mode (median)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    from streamer.runtime.cluster.jvm_archive import archive_path
    from streamer.runtime.cluster.spark import check_java
    from streamer.runtime.cluster.standalone import spark_home

    archive = archive_path(check_java(), str(spark_home()))
    if not archive.is_file():
        sys.exit(f"no class archive at {archive} yet: run any `streamer run` once first")
    print(f"load average before: {os.getloadavg()[0]:.2f}; archive {archive}")
    modes = {"Spark's own start": "spark", "streamer's archive": "archive"}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
    for _ in range(args.repeat):
        for name, mode in modes.items():
            runs[name].append(sample(mode, args.master))
    print(f"{'start':<22}{'to session':>12}{'to 1st job':>12}{'CPU (s)':>10}")
    medians = {}
    for name, samples in runs.items():
        medians[name] = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
        m = medians[name]
        print(f"{name:<22}{m['session']:>11.2f}s{m['job']:>11.2f}s{m['cpu']:>10.2f}")
    ours, theirs = medians["streamer's archive"], medians["Spark's own start"]
    print(f"ratio (archive / Spark's): to 1st job {ours['job'] / theirs['job']:.2f}, "
          f"CPU {ours['cpu'] / theirs['cpu']:.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
