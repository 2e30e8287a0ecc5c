"""Accounts of the web application: users and their passwords (accounts/sessions.py has their sessions)."""

import functools
import gzip
import os
import re
import secrets
import unicodedata
from pathlib import Path

from flask import current_app
from peewee import IntegrityError, PostgresqlDatabase, fn
from werkzeug.exceptions import ServiceUnavailable, Unauthorized
from werkzeug.security import check_password_hash, generate_password_hash

from accounts import emailtokens, securitylog
from accounts.models import PROTECTION_MODELS
from accounts.refusals import Refused
from models import (
    Membership,
    Organisation,
    SecurityEvent,
    Session,
    User,
    create_personal_organisation,
    db,
    personal_organisation,
    release_connection,
)
from store.connections import greenlets_share_thread

USERNAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{3,32}")
EMAIL_PATTERN = re.compile(r"[^@\s]{1,64}@[^@\s]+\.[^@\s]+")
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Besides control characters: invisible formatting (bidi overrides, zero widths) and line or
# paragraph separators, which can make one name look like another.
REFUSED_CATEGORIES = {"Cc", "Cf", "Zl", "Zp"}
MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 1024
# scrypt's block size and parallelism; its cost N is the PASSWORD_HASH_COST setting.
SCRYPT_BLOCKS = "8:1"
SCRYPT_COST = re.compile(r"scrypt:([0-9]+):")
# Django's list of 20,000 common passwords by Royce Williams (lower case), BSD licence: data/README.md.
COMMON_PASSWORDS = Path(__file__).resolve().parent.parent / "data" / "common-passwords.txt.gz"
# Password hashing runs in these threads, at this niceness, so log-ins wait for each other and
# not the API (hashlib.scrypt releases the GIL).
HASHING_THREADS = 2
HASHING_NICENESS = 10
# Hashes waiting beyond this many are refused at once (503): a flood of log-ins must not queue
# without end, each holding a connection and a greenlet.
HASHING_QUEUE_LIMIT = 32


class AccountTaken(ValueError):
    """The username or the email already belongs to an account."""


class WrongPassword(ValueError):
    """The password given to confirm a change is not the account's."""


class AccountGone(Unauthorized):
    """The account was deleted while a change to it was under way (HTTP 401)."""

    description = "This account no longer exists."


class HashingBusy(ServiceUnavailable):
    """Too many passwords are waiting to be checked (HTTP 503, with Retry-After)."""

    description = "Too many log-ins are being checked right now; try again in a few seconds."

    def get_headers(self, environ=None, scope=None):
        return [*super().get_headers(environ, scope), ("Retry-After", "5")]


def refuse_control_characters(value, what, field=None):
    """Raise Refused (a ValueError) with a sentence, about the field when one is named, when value
    holds NUL, another control character or an invisible formatting character."""
    if any(unicodedata.category(character) in REFUSED_CATEGORIES for character in value):
        raise Refused(f"{what} cannot contain control characters (such as NUL, tabs or line breaks) "
                      "or invisible formatting characters.", field)


@functools.cache
def common_passwords():
    with gzip.open(COMMON_PASSWORDS, "rt", encoding="utf-8") as lines:
        return frozenset(line.strip() for line in lines)


def check_new_password(password):
    """Raise Refused (a ValueError) about the "password" with a sentence when it may not be used."""
    refuse_control_characters(password, "A password", "password")
    if len(password) < MIN_PASSWORD_LENGTH:
        raise Refused(f"A password needs at least {MIN_PASSWORD_LENGTH} characters.", "password")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise Refused(f"A password has at most {MAX_PASSWORD_LENGTH} characters.", "password")
    if not password.strip() or password.lower().strip() in common_passwords():
        raise Refused("That password is one of the most common passwords; choose another.", "password")


_hashing_pool = None
_hashes_waiting = 0


def off_the_loop(function, *args):
    """Run a password hash in the hashing pool when greenlets share the thread (the server), so the
    event loop goes on serving while it runs; elsewhere (the CLI, tests) run it here. Raise
    HashingBusy when HASHING_QUEUE_LIMIT hashes are already waiting."""
    global _hashing_pool, _hashes_waiting
    if not greenlets_share_thread():
        return function(*args)
    if _hashes_waiting >= HASHING_QUEUE_LIMIT:
        raise HashingBusy()
    if _hashing_pool is None:
        from gevent.threadpool import ThreadPool

        _hashing_pool = ThreadPool(HASHING_THREADS)
    if not db.in_transaction():
        # A pooled connection held while waiting for the pool would starve the API of connections.
        release_connection()
    _hashes_waiting += 1
    try:
        return _hashing_pool.apply(_niced, (function, *args))
    finally:
        _hashes_waiting -= 1


def _niced(function, *args):
    # On Linux the niceness belongs to the calling thread only: the worker's loop keeps its own.
    # Windows has no niceness (no os.getpriority): there the hashes run at normal priority, still
    # off the loop and at most HASHING_THREADS at a time.
    if hasattr(os, "getpriority") and os.getpriority(os.PRIO_PROCESS, 0) < HASHING_NICENESS:
        os.setpriority(os.PRIO_PROCESS, 0, HASHING_NICENESS)
    return function(*args)


def password_method():
    return f"scrypt:{current_app.config['PASSWORD_HASH_COST']}:{SCRYPT_BLOCKS}"


def hash_password(password):
    """Return a salted scrypt hash of a password, at the PASSWORD_HASH_COST setting."""
    return off_the_loop(generate_password_hash, password, password_method())


def password_matches(user, password):
    """Return True when the password is the user's."""
    return off_the_loop(check_password_hash, user.password_hash, password)


@functools.cache
def unknown_user_hash(method):
    return off_the_loop(generate_password_hash, secrets.token_hex(), method)


def rehash_if_weaker(user, password):
    """Hash the password again when its hash is cheaper than PASSWORD_HASH_COST (the setting was
    raised since it was made), so a raised cost reaches every account as it logs in. The hash is
    replaced only if unchanged meanwhile (a password changed at the same time stays), and user
    then holds the new one, which the session and a pending two-factor log-in compare against.
    With the hashing pool full, the log-in goes on and the hash waits for the next one."""
    found = SCRYPT_COST.match(user.password_hash)
    if found and int(found[1]) >= current_app.config["PASSWORD_HASH_COST"]:
        return
    try:
        stronger = hash_password(password)
    except HashingBusy:
        return
    replaced = User.update(password_hash=stronger).where(
        (User.id == user.id) & (User.password_hash == user.password_hash)).execute()
    if replaced:
        user.password_hash = stronger


def find_user(username):
    """Return the user with this username, whatever its case, or None."""
    return User.get_or_none(fn.LOWER(User.username) == username.strip().lower())


def user_for_login(username, password):
    """Return the user with this username and password, or None; an unknown username takes as long
    as a wrong password, so timing does not tell which usernames exist."""
    user = find_user(username)
    if user is None:
        off_the_loop(check_password_hash, unknown_user_hash(password_method()), password)
        return None
    if not password_matches(user, password):
        if securitylog.failures_this_hour(user.id) < securitylog.FAILURES_RECORDED_PER_HOUR:
            securitylog.record(user.id, "user.login_failed")
        return None
    rehash_if_weaker(user, password)
    return user


def checked_email(email):
    """The address as an account keeps it (trimmed, lower case); Refused about the "email" with a
    sentence when it is not one."""
    email = email.strip().lower()
    refuse_control_characters(email, "An email address", "email")
    if len(email) > 254 or not EMAIL_PATTERN.fullmatch(email):
        raise Refused("That does not look like an email address.", "email")
    return email


def create_user(username, email, password, on_created=None):
    """Create and return a user, or raise Refused (naming the field) or AccountTaken with a sentence;
    on_created(user) runs inside the creation's transaction (the web's sign-up mails a link)."""
    username = username.strip()
    refuse_control_characters(username, "A username", "username")
    if not USERNAME_PATTERN.fullmatch(username):
        raise Refused("A username is 3 to 32 letters, digits, dots, dashes or underscores.", "username")
    email = checked_email(email)
    check_new_password(password)
    if find_user(username) is not None:
        raise AccountTaken(f"The username {username!r} is already taken.")
    if User.select().where(User.email == email).exists():
        raise AccountTaken(f"The email {email!r} already belongs to an account.")
    password_hash = hash_password(password)
    try:
        with db.atomic():
            user = User.create(username=username, email=email, password_hash=password_hash)
            # Sessions, events and memberships left behind by an account deleted outside the service
            # (no foreign keys enforced) must not reach this one if it got the same id.
            Session.delete().where(Session.user == user.id).execute()
            SecurityEvent.delete().where(SecurityEvent.user == user.id).execute()
            Membership.delete().where(Membership.user == user.id).execute()
            Organisation.update(personal_for=None).where(Organisation.personal_for == user.id).execute()
            create_personal_organisation(user)
            # A passkey or an authenticator left behind would open, or lock, the new account.
            for model in PROTECTION_MODELS:
                model.delete().where(model.user == user.id).execute()
            securitylog.record(user.id, "user.signup")
            if on_created is not None:
                on_created(user)
            return user
    except IntegrityError:
        raise AccountTaken("That username or email was taken a moment ago.") from None


def change_password(user, current_password, new_password, *, checked=True):
    """Set a new password after checking the current one (unless not checked: the command line); end
    every session of the account (the caller starts a new one for the browser that made the change)
    and void its reset links: one mailed before may be in other hands."""
    if checked and not password_matches(user, current_password):
        raise WrongPassword("The current password is not correct.")
    check_new_password(new_password)
    user.password_hash = hash_password(new_password)
    with db.atomic():
        lock_user(user)
        User.update(password_hash=user.password_hash).where(User.id == user.id).execute()
        Session.delete().where(Session.user == user.id).execute()
        emailtokens.void(user.id, emailtokens.PASSWORD_RESET)
        securitylog.record(user.id, "user.password_changed")


def personal_organisation_id(user):
    """The id of the user's personal organisation; AccountGone once the account is deleted."""
    personal = personal_organisation(user.id)
    if personal is None:
        raise AccountGone()
    return personal.id


def lock_user(user):
    """Hold the user's row until the transaction ends, so two requests cannot both pass a cap; raise
    AccountGone when the account was deleted since it was read (its rows could not be added to)."""
    if isinstance(db.obj, PostgresqlDatabase):
        found = User.select(User.id).where(User.id == user.id).for_update().first() is not None
    else:
        # On SQLite a write first: a transaction that reads first cannot write once another worker
        # has committed (database is locked, at once), while a first write waits its turn.
        found = User.update(created_at=User.created_at).where(User.id == user.id).execute() > 0
    if not found:
        raise AccountGone()
