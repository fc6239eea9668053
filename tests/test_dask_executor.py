"""Stages can run on a dask.distributed cluster (a real local scheduler and worker process)."""

from __future__ import annotations

import os

import pytest

import zoo
from cli_helpers import write_recipe, zoo as zoo_cli

distributed = pytest.importorskip("distributed", reason="the dask extra is part of the dev set-up")


@pytest.fixture(scope="module")
def cluster():
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None)
    yield cluster
    cluster.close()


RECIPE = """\
schema_version: 1
name: on-dask
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "dask"}}
  b: {kind: concat}
"""


def test_run_on_a_dask_cluster(tmp_path, cluster):
    recipe = write_recipe(tmp_path, RECIPE)
    result = zoo.run(recipe, executor=f"dask://{cluster.scheduler_address.removeprefix('tcp://')}")
    assert result.ok, [s.error for s in result.stages]
    assert [s.state for s in result.stages] == ["done", "done"]
    # the stage ran in the dask worker's process
    with distributed.Client(cluster) as client:
        worker_pids = set(client.run(os.getpid).values())
    assert result.stages[0].metrics["pid"] in worker_pids
    cli = zoo_cli("run", recipe, "--executor", cluster.scheduler_address)
    assert cli.code == 0 and "0 ran, 2 cached" in cli.out


def test_failure_on_dask_is_reported_like_locally(tmp_path, cluster):
    recipe = write_recipe(tmp_path, RECIPE.replace('{kind: concat}', '{kind: failing, config: {message: "remote boom"}}'))
    result = zoo.run(recipe, executor=cluster.scheduler_address)
    assert [s.state for s in result.stages] == ["done", "failed"]
    assert "remote boom" in result.failed[0].error.message


def test_a_scheduler_that_does_not_answer_is_one_line_naming_its_address(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on once this socket closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = write_recipe(tmp_path, RECIPE)
    # dask's connect timeout (30 s by default) made short: the test is about the message
    cli = zoo_cli("run", recipe, "--executor", f"dask://127.0.0.1:{port}",
                  env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"})
    assert cli.code == 3, cli.text
    assert f"no Dask scheduler answered at tcp://127.0.0.1:{port}" in cli.err
    assert "dask scheduler" in cli.err and "Traceback" not in cli.text
