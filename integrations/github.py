"""POST /api/v1/integrations/github/secret-scanning: GitHub's reports of this service's secrets
found in public. Each report is verified against GitHub's keys (integrations/githubkeys.py); each
active key it names is revoked as leaked, as POST /api/v1/keys/revoke does; the answer labels each
token for GitHub's feedback. Served when GITHUB_SECRET_SCANNING is on."""

import json
import logging
import time

from flask import Blueprint, current_app, request
from werkzeug.exceptions import BadRequest, ServiceUnavailable, Unauthorized

import ratelimit
from accounts import securitylog
from integrations.githubkeys import READ_AGAIN_AFTER, GitHubKeys, KeysUnavailable, signature_holds
from keys import keycache, keyformat
from keys.lookup import find_active_key
from mail import notices
from models import ApiKey, db
from orgs import keyactions
from serving import bodylimit
from store.writelock import write_transaction

log = logging.getLogger(__name__)

PATH = "/api/v1/integrations/github/secret-scanning"
# 1,000 entries are ~150 KB: a report is allowed more than MAX_BODY_BYTES' default.
MAX_REPORT_BYTES = 1024 * 1024
MAX_ENTRIES = 1000
# GitHub's identifiers are 64 hex digits and its signatures ~100 characters: far longer is not GitHub's.
MAX_HEADER_LENGTH = 512
MAX_URL_LENGTH = 2000
IDENTIFIER_HEADER = "Github-Public-Key-Identifier"
SIGNATURE_HEADER = "Github-Public-Key-Signature"
REVOKE_ATTEMPTS = 3
# Revocations committed together: a commit waits for the disk, a thousand of them for seconds, while
# a write lock held for a few dozen revocations holds other writers for a tenth of a second at most.
ENTRIES_PER_TRANSACTION = 25
TRUE_POSITIVE, FALSE_POSITIVE = "true_positive", "false_positive"

integrations = Blueprint("integrations", __name__, url_prefix="/api/v1/integrations")


class InvalidReportSignature(Unauthorized):
    """A report without a signature GitHub's keys verify (HTTP 401)."""

    error_code = "invalid_signature"

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("WWW-Authenticate", 'GitHub-Signature realm="secret-scanning"')]


class InvalidReport(BadRequest):
    """A signed body that is not a report (HTTP 400); the sentence never quotes it."""

    error_code = "invalid_request"


class KeysUnreachable(ServiceUnavailable):
    """GitHub's keys could not be read to judge a report (HTTP 503, with Retry-After): GitHub sends it
    again later."""

    error_code = "service_unavailable"


def init_app(app):
    """Serve the reports' path, with its larger body limit, when GITHUB_SECRET_SCANNING is on; while
    it is off the path is unknown, whatever the method."""
    if app.config["GITHUB_SECRET_SCANNING"]:
        app.extensions["github_keys"] = GitHubKeys(app.config["GITHUB_SECRET_SCANNING_KEYS_URL"])
        bodylimit.allow_larger_bodies(app, PATH, MAX_REPORT_BYTES)
        app.register_blueprint(integrations)


@integrations.post("/github/secret-scanning")
def github_secret_scanning():
    ratelimit.limit_client_ip()
    body = verified_body()
    entries = parse_report(body)
    labels = {}
    # Each token once, with its first url, in one order whatever the report's: two reports at once
    # then lock their keys' rows in the same order.
    reported = sorted({token: url for token, _, url, _ in reversed(entries)}.items())
    with securitylog.trims_deferred(lambda: write_transaction(db.obj)), notices.remembered():
        for start in range(0, len(reported), ENTRIES_PER_TRANSACTION):
            # Each key's change announced once its transaction has committed, never before.
            with keycache.announced_after_commit(), write_transaction(db.obj):
                for token, url in reported[start:start + ENTRIES_PER_TRANSACTION]:
                    labels[token] = judge(token, url)
            # SQLite's calls never yield under gevent: let the worker's other requests run between transactions.
            time.sleep(0)
    log.info("GitHub reported %d tokens: %d of this service's secrets, %d revoked now.", len(entries),
             sum(label != FALSE_POSITIVE for label in labels.values()),
             sum(label == "revoked" for label in labels.values()))
    return [{"token_hash": keyformat.hash_key(token), "token_type": token_type,
             "label": FALSE_POSITIVE if labels[token] == FALSE_POSITIVE else TRUE_POSITIVE}
            for token, token_type, _, _ in entries]


def verified_body():
    """The raw body, once its signature holds under the key its identifier names; else
    InvalidReportSignature, or KeysUnreachable when GitHub's keys cannot be read to tell."""
    identifier = request.headers.get(IDENTIFIER_HEADER, "").strip()
    signature = request.headers.get(SIGNATURE_HEADER, "").strip()
    if not identifier or not signature:
        raise InvalidReportSignature(f"A report must be signed: the headers {IDENTIFIER_HEADER} and "
                                     f"{SIGNATURE_HEADER} are missing.")
    if len(identifier) > MAX_HEADER_LENGTH or len(signature) > MAX_HEADER_LENGTH:
        raise InvalidReportSignature("The report's signature does not verify with GitHub's keys.")
    try:
        key = current_app.extensions["github_keys"].key_for(identifier)
    except KeysUnavailable:
        raise KeysUnreachable("GitHub's public keys could not be read to verify the report; send it again "
                              "later.", retry_after=READ_AGAIN_AFTER) from None
    if key is None:
        raise InvalidReportSignature("The report is signed with a key GitHub does not list.")
    body = request.get_data(cache=True)
    if not signature_holds(key, body, signature):
        raise InvalidReportSignature("The report's signature does not verify with GitHub's keys.")
    return body


def parse_report(body):
    """[(token, type, url, source), ...] of a report: a JSON array of at most MAX_ENTRIES objects,
    each with the strings token and type, and url and source as strings when given (absent or null:
    ""); other fields are ignored. InvalidReport names what is wrong, never a value."""
    try:
        report = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidReport("The report is not JSON in UTF-8.") from None
    if not isinstance(report, list):
        raise InvalidReport('A report is a JSON array of {"token", "type", "url", "source"} objects.')
    if len(report) > MAX_ENTRIES:
        raise InvalidReport(f"A report holds at most {MAX_ENTRIES:,} entries; this one holds {len(report):,}.")
    entries = []
    for number, entry in enumerate(report):
        if not isinstance(entry, dict):
            raise InvalidReport(f"Entry {number} of the report is not an object.")
        for field in ("token", "type", "url", "source"):
            value = entry.get(field)
            if not isinstance(value, str) and (field in ("token", "type") or value is not None):
                raise InvalidReport(f"Entry {number} of the report has no string {field}.")
            if isinstance(value, str) and not encodable(value):
                raise InvalidReport(f"Entry {number} of the report has a {field} that is not UTF-8 text.")
        entries.append((entry["token"], entry["type"], link(entry.get("url") or ""), entry.get("source") or ""))
    return entries


def encodable(text):
    """False for a string JSON's escapes made of a lone surrogate, which no UTF-8 holds."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def link(url):
    """The url as the event, the log and the mail carry it: a link's length, not a report's, and
    no control character (a line break would add lines to the mail's text)."""
    return "".join(character for character in url[:MAX_URL_LENGTH] if character.isprintable())


def judge(token, url):
    """What the token is here: "revoked" when this report revoked it (or ended its rolled-out secret),
    "issued" for another secret this service issued (revoked, expired, rolled out), else
    FALSE_POSITIVE. A revocation is made as POST /api/v1/keys/revoke makes it."""
    if not current_app.extensions["keys"].forms.admit(token):
        return FALSE_POSITIVE  # neither this service's form nor a start imports declared: no lookup
    token_hash = keyformat.hash_key(token)
    # A roll or revocation between the lookup and the change makes the secret something else: look again.
    for _ in range(REVOKE_ATTEMPTS):
        key = find_active_key(token_hash)
        if key is None:
            return "issued" if issued(token_hash) else FALSE_POSITIVE
        if key.opened_by_previous_secret():
            # Its holder was to lose access at the end of the grace, not to end the owner's new secret.
            if keyactions.revoke_previous_secret(key):
                return "revoked"
        elif keyactions.revoke_key(key, leaked=True, report={"source": "github", "url": url}):
            return "revoked"
    raise ServiceUnavailable("A reported key changed while it was being revoked; send the report again.")


def issued(token_hash):
    """True when a key of this service has or had this secret (current or rolled out), whatever its state."""
    return ApiKey.select(ApiKey.id).where((ApiKey.key_hash == token_hash)
                                          | (ApiKey.previous_key_hash == token_hash)).exists()
