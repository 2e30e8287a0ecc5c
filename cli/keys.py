"""The `keys` command group: create, list, roll, revoke, update, limit a key, its credits, and scan
files for secrets."""

import codecs
import re
import sys
from pathlib import Path

import click
from peewee import JOIN

import ratelimit
from cli.commands import CommandGroup, find_user, warn_if_servers_may_not_hear
from cli.orgs import find_organisation, org_option, organisation_for
from keys import imported, keyformat, leaks
from metering import credits
from models import SCOPES, ApiKey, User, display_time, iso_seconds
from orgs import keyactions, keyedits, keyimports, roles

keys_cli = CommandGroup("keys", help="Manage API keys.")


@keys_cli.command("create")
@click.argument("username")
@click.option("--name", required=True, help="A name for the key.")
@click.option("--type", "key_type", required=True, type=click.Choice(sorted(keyformat.KEY_PREFIXES)))
@click.option("--tier", default="free", show_default=True, help="A tier of RATE_LIMIT_TIERS.")
@click.option("--expires-in", default="never", show_default=True, metavar="DURATION",
              help="30d, 24h, 90m, 45s or never.")
@click.option("--scopes", default=",".join(SCOPES), show_default=True, metavar="S,S",
              help="Comma-separated scopes.")
@click.option("--allow-ips", default="", metavar="CIDR,CIDR",
              help="Comma-separated addresses or networks the key may be used from (default: any).")
@click.option("--credits", "credit_count", metavar="N", help="Requests the key may make in all (default: no limit).")
@click.option("--refill", default="", metavar="N/day|N/month", help="Set its credits to N at 00:00 UTC each day "
              "or on the 1st of each month.")
@org_option
def create_key_command(username, name, key_type, tier, expires_in, scopes, allow_ips, credit_count, refill, org_slug):
    """Create an API key made by USERNAME, in its personal organisation or --org's (where its role
    must allow creating keys); its secret is printed once, alone on the last line."""
    user = find_user(username)
    org = organisation_for(user, org_slug, roles.KEY_CREATE)
    try:
        if not scopes.strip(","):
            raise ValueError("Name at least one scope.")
        key, secret = keyactions.issue_key(
            user, name, key_type, tier, expires_in=keyactions.parse_duration(expires_in),
            scopes=scopes.split(","), allow_ips=allow_ips,
            credits_given=None if credit_count is None else credits.parse_credits(credit_count),
            refill=credits.parse_refill(refill), org=org.id)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    where = f" in {org.slug}" if org_slug is not None else ""
    click.echo(f"Created {key.key_type} key {key.name!r} (id {key.id}) for {user.username}{where}.")
    if key.credits_remaining is not None:
        click.echo(f"Its credits: {credits.describe(key, with_next=True)}.")
    click.echo("Copy the secret now; it is not stored and cannot be shown again:")
    click.echo(secret)


@keys_cli.command("list")
@click.argument("username")
@org_option
def list_keys_command(username, org_slug):
    """List the keys of a user's personal organisation: id, name, type, prefix, tier, status (active,
    expired or revoked), expiry, scopes, IP allow-list (any when empty), its own windows
    (limit=10/second+5000/hour) or - for its tier's (tab-separated; never the secret). With --org,
    every key of that organisation, of which the user must be a member, each line ending with its
    creator's username (- for a deleted account). A key revoked as leaked ends its line with who
    reported it and when ("revoked: reported by GitHub at URL on TIME")."""
    user = find_user(username)
    org = organisation_for(user, org_slug, roles.VIEW)
    keys = (ApiKey.select(ApiKey, User.username).join(User, JOIN.LEFT_OUTER, on=(ApiKey.user == User.id))
            .where(ApiKey.org == org.id).order_by(ApiKey.id).objects())
    for key in keys:
        state = "revoked" if key.revoked_at else "expired" if key.is_expired() else "active"
        expiry = iso_seconds(key.expires_at) if key.expires_at else "never"
        fields = [key.id, key.name, key.key_type, f"{key.display_prefix}...", key.rate_limit_tier, state, expiry,
                  ",".join(key.scope_list()), key.allow_ips or "any",
                  f"limit={key.rate_limits}" if key.rate_limits else "-"]
        if org_slug is not None:
            fields.append(key.username or "-")
        if key.leak_report:
            fields.append(f"revoked: {leaks.reported(key)} on {iso_seconds(key.revoked_at)}")
        click.echo("\t".join(map(str, fields)))


@keys_cli.command("roll")
@click.argument("key_id", type=int)
@click.option("--grace", default="24h", show_default=True, metavar="DURATION",
              help="How long the current secret keeps working: 24h, 90m, 7d, or 0 for not at all.")
@click.option("--end-previous", is_flag=True,
              help="Confirm ending a previous secret that is still in its grace period.")
def roll_key_command(key_id, grace, end_previous):
    """Give a key a new secret, printed once, alone on the last line; it keeps its id, allowance and usage."""
    key = find_key(key_id)
    if key.revoked_at or key.is_expired():
        state = "revoked" if key.revoked_at else "expired"
        raise click.ClickException(f"Key {key_id} is {state}; it cannot be rolled.")
    try:
        seconds = keyactions.parse_duration(grace, allow_never=False)
        secret = keyactions.roll_key(key, seconds, end_previous=end_previous)
    except keyactions.GraceRunning as error:
        raise click.ClickException(f"{error} Add --end-previous to confirm.") from None
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    warn_if_servers_may_not_hear()
    previous_until = ApiKey.get_by_id(key_id).previous_expires_at
    until = f"until {display_time(previous_until)}" if previous_until else "no longer"
    click.echo(f"Rolled key {key_id} ({key.name!r}); the previous secret works {until}.")
    click.echo("Copy the new secret now; it is not stored and cannot be shown again:")
    click.echo(secret)


def find_key(key_id):
    # An id past the database's integer range is no key's, not a database error.
    key = ApiKey.get_or_none(ApiKey.id == key_id) if 0 < key_id < 2**63 else None
    if key is None:
        raise click.ClickException(f"There is no API key with id {key_id}.")
    return key


@keys_cli.command("revoke")
@click.argument("key_id", type=int)
def revoke_key_command(key_id):
    """Revoke a key; it fails from the next request on."""
    key = find_key(key_id)
    already = key.revoked_at is not None
    keyactions.revoke_key(key, again=True)
    click.echo(f"Key {key_id} was already revoked." if already else f"Revoked key {key_id} ({key.name!r}).")
    warn_if_servers_may_not_hear()


@keys_cli.command("limit")
@click.argument("key_id", type=int)
@click.argument("rates", required=False, metavar="RATE[+RATE...]")
@click.option("--tier", "back_to_tier", is_flag=True, help="Return the key to its tier's windows.")
def limit_key_command(key_id, rates, back_to_tier):
    """Give a key its own windows (10/second+5000/hour) in place of its tier's, or --tier to return it."""
    if (rates is None) != back_to_tier:
        raise click.ClickException("Give the key's windows (for example 10/second+5000/hour) or --tier, not both.")
    key = find_key(key_id)
    try:
        limits = None if back_to_tier else ratelimit.parse_limits(rates)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    keyactions.limit_key(key, limits)
    warn_if_servers_may_not_hear()
    whose = f"its own windows, {limits}" if limits else f"its tier's windows ({key.rate_limit_tier})"
    click.echo(f"Key {key_id} ({key.name!r}) now has {whose}.")


@keys_cli.command("credits")
@click.argument("key_id", type=int)
@click.option("--set", "set_to", metavar="N", help="Set the key's credits to N.")
@click.option("--add", metavar="N", help="Add N credits to the key's.")
@click.option("--refill", default="", metavar="N/day|N/month", help="Set its credits to N at 00:00 UTC each day "
              "or on the 1st of each month.")
@click.option("--no-refill", is_flag=True, help="Take the key's refill away.")
def credits_command(key_id, set_to, add, refill, no_refill):
    """Print a key's credits (requests it may make), its refill and the next one; or set or add to
    them, and give or take away its refill."""
    if set_to is None and add is None and not refill and not no_refill:
        key = find_key(key_id)
        if key.credits_remaining is None:
            click.echo(f"Key {key_id} ({key.name!r}) has no credits: only its windows limit it.")
        else:
            click.echo(f"Key {key_id} ({key.name!r}): {credits.describe(key, with_next=True)}.")
        return
    if (set_to is None) == (add is None):
        raise click.ClickException("Give either --set N or --add N.")
    if refill and no_refill:
        raise click.ClickException("Give either --refill or --no-refill, not both.")
    key = find_key(key_id)
    try:
        set_to = None if set_to is None else credits.parse_credits(set_to, "--set")
        add = None if add is None else credits.parse_credits(add, "--add")
        key = keyactions.grant_credits(key, set_to=set_to, add=add, refill=credits.parse_refill(refill),
                                       no_refill=no_refill)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    warn_if_servers_may_not_hear()
    click.echo(f"Key {key_id} ({key.name!r}): {credits.describe(key)}.")


@keys_cli.command("update")
@click.argument("key_id", type=int)
@click.option("--name", help="A new name.")
@click.option("--scopes", metavar="S,S", help="The key's scopes, comma-separated: those not named are taken away.")
@click.option("--allow-ips", metavar="CIDR,CIDR", help="The addresses or networks it may be used from; '' for any.")
@click.option("--expires-in", metavar="DURATION", help="A new expiry from now: 30d, 24h, 90m, 45s, or never.")
@click.option("--tier", help="A tier of RATE_LIMIT_TIERS.")
def update_key_command(key_id, name, scopes, allow_ips, expires_in, tier):
    """Change an active key in place; it applies from the next request on, on every server. Credits
    and the key's own windows keep `keys credits` and `keys limit`."""
    given = {field: value for field, value in (("name", name), ("allow_ips", allow_ips), ("tier", tier))
             if value is not None}
    try:
        if scopes is not None:
            if not scopes.strip(","):
                raise ValueError("Name at least one scope.")
            given["scopes"] = scopes.split(",")
        if expires_in is not None:
            given["expires_in"] = keyactions.parse_duration(expires_in)
        if not given:
            raise ValueError("Name what to change: --name, --scopes, --allow-ips, --expires-in or --tier.")
        changed = keyedits.update_key(find_key(key_id).id, may_widen=True, **given)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    key = ApiKey.get_by_id(key_id)
    if not changed:
        click.echo(f"Key {key_id} ({key.name!r}) already has these; nothing changed.")
        return
    warn_if_servers_may_not_hear()
    click.echo(f"Changed {', '.join(changed)} of key {key_id} ({key.name!r}).")


@keys_cli.command("import")
@click.argument("file", type=click.File("rb"))
@click.option("--org", "org_slug", required=True, metavar="SLUG", help="The organisation the keys join.")
@click.option("--dry-run", is_flag=True, help="Check every line and write nothing.")
def import_keys_command(file, org_slug, dry_run):
    """Import keys another system issued, by their hash, from a JSON Lines FILE (- for standard
    input; docs/importing-keys.md): one output line per input line, then a summary; exit 1 when a
    line was refused."""
    org = find_organisation(org_slug)
    try:
        outcomes = keyimports.import_keys(org.id, file.read(keyimports.MAX_BYTES + 1), dry_run=dry_run)
    except keyimports.ImportTooLarge as error:
        raise click.ClickException(str(error)) from None
    for outcome in outcomes:
        click.echo(outcome)
    click.echo(keyimports.summary(outcomes, dry_run))
    if any(outcome.refused for outcome in outcomes):
        sys.exit(1)


# What looks like one of this service's secrets, wherever it stands: escapes (JSON's \n, \u0022,
# C's \x3d, URL encoding's %3D, an ANSI colour) end in a letter or digit just before a key, so no
# boundary is asked for before it; the checksum tells a key from a lookalike.
SECRET_IN_TEXT = re.compile(keyformat.KEY_PATTERN.pattern)
# What may follow an imported key's declared start: the characters secrets are commonly made of.
IMPORTED_SECRET_TAIL = re.compile(r"[A-Za-z0-9_\-+/=.~]*")
# Lines are read in pieces of at most this many characters, so a file without line breaks (a
# binary, a minified bundle) is not read into memory whole.
SCAN_PIECE = 1 << 20


@keys_cli.command("scan")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
def scan_command(paths):
    """Find secrets in files (folders recursively): print PATH:LINE: <prefix>... checksum ok|bad,
    never the secret; exit 1 when one with a valid checksum was found (for a pre-commit hook)."""
    found, unreadable = False, False
    forms = imported.DeclaredForms(lambda: None)
    forms.refresh()
    for path in files_under(paths):
        try:
            for number, secret, declared in secrets_in(path, forms.starts):
                if declared:
                    # No checksum tells an imported key from a lookalike: its declared start is enough.
                    click.echo(f"{path}:{number}: {declared}... an imported key's start")
                    found = True
                    continue
                valid = checksummed(secret)
                click.echo(f"{path}:{number}: {secret[:keyformat.DISPLAY_PREFIX_LENGTH]}... "
                           f"checksum {'ok' if valid else 'bad'}")
                found |= valid
        except OSError as error:
            click.echo(f"{path}: cannot be read: {error.strerror}", err=True)
            unreadable = True
    # 1 is kept for "a secret was found", so that a hook can tell it from a scan that failed.
    if found:
        sys.exit(1)
    if unreadable:
        sys.exit(2)


def files_under(paths):
    """Regular files: those named, and those under the folders named (not in .git)."""
    for path in paths:
        if path.is_dir():
            yield from sorted(file for file in path.rglob("*") if file.is_file() and ".git" not in file.parts)
        elif path.is_file():
            yield path


def checksummed(secret):
    return len(secret) == keyformat.CHECKSUMMED_LENGTH and not keyformat.checksum_fails(secret)


def found_secret(text):
    """A secret-like run of characters as reported: a valid key followed by letters or digits (an
    escape such as %0A, or text glued to it) is that key."""
    head = text[:keyformat.CHECKSUMMED_LENGTH]
    return head if checksummed(head) else text


def encoding_of(path):
    """UTF-16 for a file that starts with its byte order mark (PowerShell writes those), else UTF-8."""
    with path.open("rb") as file:
        start = file.read(2)
    return "utf-16" if start in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else "utf-8"


def secrets_in(path, declared_starts):
    """(line number, text, None) of each secret-like string in the file, and (line number, None,
    the start) of each string that begins with a start imported keys declared (by length)."""
    with path.open(encoding=encoding_of(path), errors="replace") as lines:
        number, carry = 1, ""
        while piece := lines.readline(SCAN_PIECE):
            text = carry + piece
            cut = len(piece) == SCAN_PIECE and not piece.endswith("\n")
            found = [(match.end(), found_secret(match[0]), None) for match in SECRET_IN_TEXT.finditer(text)]
            found += [(end, None, start) for end, start in declared_in(text, declared_starts)]
            for end, secret, start in sorted(found, key=lambda item: item[0]):
                if end < len(carry):
                    continue  # found in the previous piece
                if cut and end == len(text):
                    continue  # it may go on in the next piece, and is found there
                yield number, secret, start
            # A piece cut inside a long line keeps its tail, so a secret across the cut is found.
            carry = text[-200:] if cut else ""
            number += piece.endswith("\n")


def declared_in(text, starts):
    """(end, start) of each run in text that begins with a declared start and, with the key
    characters after it, is as long as an imported secret may be (16 to 256 characters)."""
    firsts = {start[0] for same_length in starts.values() for start in same_length}
    for at, character in enumerate(text):
        if character not in firsts:
            continue
        for length, same_length in starts.items():
            if text[at:at + length] in same_length:
                end = IMPORTED_SECRET_TAIL.match(text, at + length).end()
                if 16 <= end - at <= 256:
                    yield end, text[at:at + length]
