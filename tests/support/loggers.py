"""gunicorn's loggers in a test, as a served worker has them."""

import contextlib


@contextlib.contextmanager
def gunicorn_handlers_alone(gunicorn_logger):
    """Within: gunicorn's access log with gunicorn's own handlers alone, set up again. pytest adds
    its capture handlers, for each phase of each test, to every logger that does not propagate, as
    gunicorn's access log once a test has set it up; they are put back before the phase ends, for
    pytest to take away itself."""
    access_log = gunicorn_logger.access_log
    others = [handler for handler in access_log.handlers if not getattr(handler, "_gunicorn", False)]
    for handler in others:
        access_log.removeHandler(handler)
    try:
        gunicorn_logger.setup(gunicorn_logger.cfg)
        yield access_log
    finally:
        for handler in others:
            access_log.addHandler(handler)
