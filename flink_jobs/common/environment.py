"""The execution environment of a job's ``main``: jars from ``--jars`` on its classpath.

The jobs know nothing of where jars live: whoever submits them (the local stack, a deployment) passes the
Kafka connector's URLs, or puts the jars on the cluster's classpath and passes none.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def add_jars_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jars", default="",
                        help="';'-separated URLs (file:///...) of jars the job needs on its classpath, such as the "
                             "Kafka connector (as Flink's pipeline.jars); none when the cluster's lib/ holds them")


def jar_urls(jars: str | Iterable[str]) -> list[str]:
    """``--jars``' value (or URLs already split) as a list, empty entries dropped."""
    return [u for u in (jars.split(";") if isinstance(jars, str) else jars) if u]


def execution_environment(jars: str | Iterable[str] = ()):
    """A StreamExecutionEnvironment with ``jars`` (URLs) added to the job's classpath."""
    from pyflink.datastream import StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment()
    urls = jar_urls(jars)
    if urls:
        env.add_jars(*urls)
    return env
