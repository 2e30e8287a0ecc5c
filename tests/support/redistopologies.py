"""Redis as operators run it on several machines, on the machine's own redis-server, on free ports:
a Redis Cluster of three masters and three replicas, and a Sentinel group of a master, a replica
and three sentinels. Each is the test's own (started for it, stopped after it, dying with the
process that started it) and is named to the service by a URL of the limits library's schemes."""

import contextlib
import os
import shutil
import signal
import subprocess
import time

import redis
import services
from liveserver import free_port
from privateservers import dying_with, wait_until_listening

SENTINEL_SERVICE = "mymaster"


def redis_program(name):
    program = shutil.which(name)
    if program is None:
        services.unavailable(f"{name} is not installed (Debian: apt-get install redis-server)")
    return program


def distinct_free_ports(count):
    """count free ports, none twice: a port the kernel hands out again before it is bound would
    start two servers on it."""
    ports = set()
    while len(ports) < count:
        ports.add(free_port())
    return list(ports)


def start_redis(folder, port, *options):
    """One redis-server in folder (its working directory), keeping nothing on disk."""
    folder.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [redis_program("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         *options], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=dying_with(os.getpid()))
    wait_until_listening(port)
    return process


def wait_until(condition, seconds=30, what="the servers to agree"):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds} s for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def redis_cluster(folder):
    """Yield the redis+cluster:// URL of a new cluster: three masters, each with a replica, every
    slot covered. Each node's bus port is chosen free too (Redis would take its port + 10000)."""
    version = subprocess.run([redis_program("redis-server"), "--version"], capture_output=True, text=True).stdout
    if int(version.partition(" v=")[2].partition(".")[0] or 0) < 7:
        services.unavailable(f"a cluster's bus port is set from Redis 7 on: {version.strip()}")
    ports = distinct_free_ports(12)
    ports, bus_ports = ports[:6], ports[6:]
    processes = []
    try:
        for port, bus_port in zip(ports, bus_ports):
            processes.append(start_redis(folder / str(port), port, "--cluster-enabled", "yes",
                                         "--cluster-port", str(bus_port), "--cluster-config-file", "nodes.conf",
                                         "--cluster-node-timeout", "2000"))
        subprocess.run([redis_program("redis-cli"), "--cluster", "create", *(f"127.0.0.1:{port}" for port in ports),
                        "--cluster-replicas", "1", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        wait_until(lambda: all(cluster_whole(port) for port in ports), what="every node to see the cluster whole")
        yield "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in ports[:3])
    finally:
        stop_all(processes)


def cluster_whole(port):
    """True once the node sees every slot served and three replicas, and (a replica) has its
    master's data: a replica that never synced would not be promoted in a failover."""
    node = redis.Redis(port=port, decode_responses=True)
    replicas = [described for described in node.cluster("NODES").values() if "slave" in described["flags"]]
    replication = node.info("replication")
    synced = replication["role"] == "master" or replication.get("master_link_status") == "up"
    return node.cluster("INFO")["cluster_state"] == "ok" and len(replicas) == 3 and synced


@contextlib.contextmanager
def redis_sentinel(folder):
    """Yield the redis+sentinel:// URL of a new group: a master, its replica, and three sentinels
    that watch it (a quorum of two)."""
    master, replica, *sentinels = distinct_free_ports(5)
    processes = []
    try:
        processes.append(start_redis(folder / "master", master))
        processes.append(start_redis(folder / "replica", replica, "--replicaof", "127.0.0.1", str(master)))
        for port in sentinels:
            config = folder / f"sentinel-{port}" / "sentinel.conf"
            config.parent.mkdir(parents=True)
            # A sentinel rewrites its file as it learns the group: each its own, writable.
            config.write_text(f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {master} 2\n"
                              f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 2000\n"
                              f"sentinel failover-timeout {SENTINEL_SERVICE} 10000\n")
            processes.append(sentinel_process(config, port))
        wait_until(lambda: redis.Redis(port=master).info("replication")["connected_slaves"] == 1,
                   what="the replica to follow the master")
        wait_until(lambda: all(redis.Redis(port=port).sentinel_master(SENTINEL_SERVICE)["num-other-sentinels"] == 2
                               for port in sentinels), what="each sentinel to know the two others")
        yield f"redis+sentinel://{','.join(f'127.0.0.1:{port}' for port in sentinels)}/{SENTINEL_SERVICE}"
    finally:
        stop_all(processes)


def sentinel_process(config, port):
    process = subprocess.Popen(
        [redis_program("redis-server"), str(config), "--sentinel", "--port", str(port), "--bind", "127.0.0.1"],
        cwd=config.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=dying_with(os.getpid()))
    wait_until_listening(port)
    return process


def stop_all(processes):
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def first_node(storage_url):
    """A client of the first host a redis+cluster:// or redis+sentinel:// URL names."""
    host, port = storage_url.partition("://")[2].partition("/")[0].split(",")[0].rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), decode_responses=True)


def cluster_nodes(storage_url, masters_only=False):
    """[(host, port)] of the nodes of the cluster behind a redis+cluster:// URL, as they stand now:
    every one, or the masters that serve slots."""
    return [(address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1].split("@")[0]))
            for address, described in first_node(storage_url).cluster("NODES").items()
            if not masters_only or ("master" in described["flags"] and described["slots"])]


def masters(storage_url):
    """[(host, port)] of the masters behind a redis+cluster:// or redis+sentinel:// URL, as they stand now."""
    if storage_url.partition("://")[0].endswith("+sentinel"):
        service = storage_url.partition("://")[2].partition("/")[2]
        return [tuple(first_node(storage_url).sentinel_get_master_addr_by_name(service))]
    return cluster_nodes(storage_url, masters_only=True)


def kill_master_holding(storage_url, pattern):
    """SIGKILL the master that holds a key matching pattern (the only master, behind Sentinel);
    return its (host, port)."""
    for host, port in masters(storage_url):
        node = redis.Redis(host=host, port=port)
        if node.keys(pattern):
            os.kill(node.info("server")["process_id"], signal.SIGKILL)
            return host, port
    raise LookupError(f"no master holds a key like {pattern}")
