"""serving/patching.py: gevent's patch of the standard library, made as gevent makes it (the same
modules and names patched, the same events to the same plugins, in order) with the installed
distributions' entry points read once. Each patch runs in a Python of its own: a patch lasts
for the process."""

import json
import subprocess
import sys
import textwrap

import pytest
from liveserver import ROOT

# A plugin of gevent's patch events, installed as a distribution of its own: it prints each event.
PLUGIN = textwrap.dedent("""\
    def record(event):
        print("event", type(event).__name__, getattr(event, "module_name", ""))
""")
GROUPS = ("will_patch_all", "will_patch_module", "did_patch_module", "did_patch_builtins", "did_patch_all")
# What each patch reports: whether it patched, what gevent saved of each module it patched, and
# how many times the installed distributions were read.
REPORT = textwrap.dedent("""\
    import json, sys
    from importlib import metadata
    reads = []
    distributions = metadata.distributions
    def counted(**kwargs):
        reads.append(1)
        return distributions(**kwargs)
    metadata.distributions = counted
    if sys.argv[1] == "gevent":
        from gevent import monkey
        patched = monkey.patch_all()
    elif sys.argv[1] == "worker":
        # As gunicorn's gevent worker patches in the forked process, its listening sockets given.
        import socket
        from serving.worker import Worker
        from gunicorn.sock import TCPSocket
        worker = Worker.__new__(Worker)
        listener = socket.create_server(("127.0.0.1", 0))
        worker.sockets = [TCPSocket.__new__(TCPSocket)]
        worker.sockets[0].sock = listener
        Worker.patch(worker)
        import gevent.socket
        patched = type(worker.sockets[0]) is gevent.socket.socket and worker.sockets[0].getsockname()[0] == "127.0.0.1"
    else:
        from serving import patching
        patched = patching.patch_all()
    from gevent import events, monkey
    saved = {module: sorted(names) for module, names in monkey.saved.items()}
    print(json.dumps({"patched": patched, "saved": saved, "reads": len(reads),
                      "notify": events.notify_and_call_entry_points.__qualname__}))
""")


@pytest.fixture(scope="module")
def plugin_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "patchrecorder.py").write_text(PLUGIN)
    info = folder / "patchrecorder-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: patchrecorder\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "".join(f"[gevent.plugins.monkey.{group}]\nrecorder = patchrecorder:record\n\n" for group in GROUPS))
    return folder


def patched_by(patcher, plugin_folder):
    """(the report, the events the plugin was told of, in order) of a patch in a new Python."""
    result = subprocess.run([sys.executable, "-c", REPORT, patcher], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, env={"PYTHONPATH": f"{plugin_folder}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    return json.loads(lines[-1]), [line for line in lines if line.startswith("event ")]


@pytest.mark.parametrize("patcher", ["service", "worker"])
def test_the_patch_is_gevents_own_with_the_entry_points_read_once(plugin_folder, patcher):
    """The patch itself, and the gunicorn worker's (serving/worker.py), which also wraps its
    listening sockets as gevent's as gunicorn's own does."""
    gevents, gevents_events = patched_by("gevent", plugin_folder)
    ours, our_events = patched_by(patcher, plugin_folder)
    assert ours["patched"] is gevents["patched"] is True
    assert ours["saved"] == gevents["saved"]
    assert {"socket", "threading", "ssl", "select", "time"} <= set(ours["saved"])
    assert our_events == gevents_events
    assert "event GeventWillPatchAllEvent " in our_events
    assert "event GeventDidPatchModuleEvent socket" in our_events
    assert our_events[-1] == "event GeventDidPatchAllEvent "
    assert ours["reads"] == 1
    # Why the module is there: gevent reads them for each event. If a new gevent reads them once,
    # its own patch will do.
    assert gevents["reads"] > len(GROUPS)
    # And the lookup gevent makes at each event is its own again once the patch is made.
    assert ours["notify"] == gevents["notify"] == "notify_and_call_entry_points"
