"""openapi.json, the OpenAPI description of the REST API, read once: the REST API serves it, the
API reference page shows it. The standard library only."""

import json
from pathlib import Path

PATH = Path(__file__).resolve().parent / "openapi.json"
OPENAPI = json.loads(PATH.read_text())
# The version's one place is the API description; status reports it, `python app.py --version` prints it.
VERSION = OPENAPI["info"]["version"]
