"""The accuracy report's promise, in a few of its cells (bench/accuracy.py): bursts of one and three
times a key's allowance, at once over the instances, admit exactly the allowance and never more,
on each storage: memory in one process, one Redis under two instances, and a real Redis Cluster
under two instances of two workers."""

import pytest
import services
from redistopologies import redis_cluster

from bench import accuracy


def cells_on(tmp_path, storage_url, instances, workers):
    deployment = accuracy.Deployment(tmp_path, services.postgres_url(), storage_url, instances, workers)
    try:
        return accuracy.measure(deployment, windows=(60,), loads=(1, 3), rounds=2)
    finally:
        deployment.close()


def assert_exact(cells):
    for (window, load), rounds in cells.items():
        assert [(one.admitted, one.refused, one.failed) for one in rounds] == [
            (accuracy.LIMIT, one.offered - accuracy.LIMIT, 0) for one in rounds], (window, load)
        assert accuracy.over_admitted(rounds, window) == 0 and accuracy.admitted_share(rounds) == 1.0


@pytest.mark.parametrize("storage, instances, workers", [("memory", 1, 1), ("redis", 2, 1)])
def test_one_process_and_one_redis_admit_exactly_the_allowance(tmp_path, storage, instances, workers):
    storage_url = "memory://" if storage == "memory" else services.redis_url()
    assert_exact(cells_on(tmp_path, storage_url, instances, workers))


def test_a_redis_cluster_admits_exactly_the_allowance(tmp_path):
    with redis_cluster(tmp_path / "cluster") as storage_url:
        assert_exact(cells_on(tmp_path, storage_url, 2, 2))
