"""The service's gunicorn settings without its hooks (which need the service's modules)."""

import runpy
from pathlib import Path

_settings = runpy.run_path(str(Path(__file__).resolve().parent.parent / "gunicorn.conf.py"))
globals().update({name: value for name, value in _settings.items()
                  if not name.startswith("_") and not callable(value) and name != "os"})
