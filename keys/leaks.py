"""A key revoked as leaked: what it keeps of the report (who reported it, where it was found) and
the words that say so."""

GITHUB, API = "github", "api"
REVOKE_ENDPOINT = "POST /api/v1/keys/revoke"


def recorded(report):
    """The api_keys columns a revocation as leaked sets: report is GitHub's ({"source": "github",
    "url": ...}), or None for whoever held the secret and sent it to REVOKE_ENDPOINT."""
    if report is None:
        return {"leak_report": API, "leak_url": None}
    return {"leak_report": report["source"], "leak_url": report.get("url") or None}


def reported(key):
    """How a key revoked as leaked was reported ("reported by GitHub at URL", "reported with POST
    /api/v1/keys/revoke"); None for any other key."""
    if key.leak_report == GITHUB:
        return "reported by GitHub" + (f" at {key.leak_url}" if key.leak_url else "")
    if key.leak_report == API:
        return f"reported with {REVOKE_ENDPOINT}"
    return None
