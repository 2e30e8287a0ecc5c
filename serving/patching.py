"""gevent's patch of the standard library, as a serving process makes it before it imports the app:
gunicorn's gevent worker (serving/worker.py) and `python app.py` where gunicorn cannot run.

gevent tells its plugins of each step of `monkey.patch_all()`, some 25 events, and for each it
asks `importlib.metadata` for the plugins' entry points, which reads every installed distribution's
metadata afresh: 0.2-0.37 s of a worker's boot with 107-126 distributions installed, where the
patch itself takes 0.04 s. Here the entry points are read once for the whole patch; each event
still goes to the same plugins, in the same order."""

from importlib import metadata

from gevent import events, monkey


def patch_all():
    """gevent's `monkey.patch_all()` with the installed entry points read once. gevent looks up
    `events.notify_and_call_entry_points` on its module at each event, so it is replaced for the
    patch's length only; tests/unit/serving/test_patching.py fails if a new gevent stops doing so."""
    entry_points = metadata.entry_points()

    def notify_and_call_entry_points(event):
        events.notify(event)
        for plugin in entry_points.select(group=event.ENTRY_POINT_NAME):
            plugin.load()(event)

    reading_each_time = events.notify_and_call_entry_points
    events.notify_and_call_entry_points = notify_and_call_entry_points
    try:
        return monkey.patch_all()
    finally:
        events.notify_and_call_entry_points = reading_each_time
