"""The service's gunicorn settings, access line included (its format, written by gunicorn's own
logger), with the one hook that shapes serving (post_request, which keeps keep-alive connections
fair) and without those that need the service's modules."""

import runpy
from pathlib import Path

_settings = runpy.run_path(str(Path(__file__).resolve().parent.parent / "gunicorn.conf.py"))
globals().update({name: value for name, value in _settings.items()
                  if not name.startswith("_") and (not callable(value) or name == "post_request") and name != "os"})
