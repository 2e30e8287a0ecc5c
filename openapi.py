"""openapi.json, the OpenAPI description of every operation of the REST API, read once: the API
reference page shows it, and the REST API serves what the running configuration serves of it. The
standard library only."""

import json
from pathlib import Path

PATH = Path(__file__).resolve().parent / "openapi.json"
OPENAPI = json.loads(PATH.read_text())
# The version's one place is the API description; status reports it, `python app.py --version` prints it.
VERSION = OPENAPI["info"]["version"]
# The keys of a path item that are operations (the others are its summary, parameters, ...).
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def described(serves):
    """OPENAPI with only the operations that serves(path, method) is true of: the description of a
    service that is not serving every feature. A tag that no operation left uses goes too."""
    paths = {}
    for path, item in OPENAPI["paths"].items():
        kept = {key: value for key, value in item.items() if key not in METHODS or serves(path, key)}
        if METHODS & kept.keys():
            paths[path] = kept
    used = {tag for item in paths.values() for key, operation in item.items() if key in METHODS
            for tag in operation.get("tags", ())}
    tags = [tag for tag in OPENAPI.get("tags", []) if tag["name"] in used]
    return {**OPENAPI, "paths": paths, **({"tags": tags} if "tags" in OPENAPI else {})}
