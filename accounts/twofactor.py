"""Two-factor log-in: TOTP authenticators, recovery codes and the half-logged-in state between
the password and the second factor."""

import datetime
import hashlib
import hmac
import re
import secrets

import pyotp

import models
from accounts import securitylog, sessions, users
from accounts.models import PendingLogin, RecoveryCode, TwoFactor
from models import Session, User, db, utcnow
from store import sealing

ISSUER = "API-key demo service"
# RFC 6238 with the parameters every authenticator app assumes: SHA-1, 6 digits, 30 s.
DIGITS = 6
STEP_SECONDS = 30
# Codes of the step before and after the current one pass too (clocks drift).
STEPS_ACCEPTED = (-1, 0, 1)
RECOVERY_CODES = 10
# 16 base32 characters, 80 bits: too many to search from a copy of the database, so a fast hash
# of them is as good as a slow one.
RECOVERY_CODE_CHARACTERS = 16
RECOVERY_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# A set-up's secret not confirmed within this is discarded.
SETUP_LIFE = datetime.timedelta(minutes=10)
NO_SETUP = ("Start the setup again: there is no authenticator waiting for a code "
            f"(a set-up lasts {SETUP_LIFE.seconds // 60} minutes).")
PENDING_LOGIN_LIFE = datetime.timedelta(minutes=5)
# Wrong codes one pending log-in may take before the password must be given again (and counted
# by its own throttle).
PENDING_LOGIN_FAILURES = 5
# Pending log-ins an account keeps (its newest): one per browser in the middle of a log-in.
PENDING_LOGINS_KEPT = 10
CODE_PATTERN = re.compile(r"[0-9]{6}")
# The purpose store/sealing.py derives the secrets' key for (the words the first release used).
SEALED_AS = "totp secret"


class WrongCode(ValueError):
    """The code is not a current TOTP code of the account, nor one of its unused recovery codes."""


def seal(secret):
    return sealing.seal(secret, SEALED_AS)


def unseal(sealed):
    """The secret, or None when SECRET_KEY changed since it was sealed."""
    return sealing.unseal(sealed, SEALED_AS)


def record_for(user):
    return TwoFactor.get_or_none(TwoFactor.user == user.id)


def is_enabled(user):
    return TwoFactor.select().where((TwoFactor.user == user.id) & TwoFactor.enabled_at.is_null(False)).exists()


def start_setup(user, session):
    """Make a new secret for the session's set-up, in place of any it had; return it. Raise
    ValueError when 2FA is on."""
    if is_enabled(user):
        raise ValueError("Two-factor authentication is already on.")
    # Kept with the session, not the account: whoever else holds a session of the account (a
    # thief whose session a password change ended, say) never sees the secret the owner scans.
    secret = pyotp.random_base32()
    Session.update(totp_setup=seal(secret), totp_setup_at=utcnow()).where(
        Session.token_hash == session.token_hash).execute()
    return secret


def setup_secret(session):
    """The secret the session's set-up waits to confirm, as the database holds it now; None when
    there is none, it is older than SETUP_LIFE, or it was sealed under a former SECRET_KEY."""
    row = Session.get_or_none(Session.token_hash == session.token_hash)
    if row is None or row.totp_setup is None or utcnow() - row.totp_setup_at > SETUP_LIFE:
        return None
    return unseal(row.totp_setup)


def end_setup(session):
    """Discard the session's set-up (the secret with it)."""
    _end_setups(Session.token_hash == session.token_hash)


def discard_old_setups(now=None):
    """Discard every set-up older than SETUP_LIFE (the hourly prune)."""
    _end_setups(Session.totp_setup_at < (now or utcnow()) - SETUP_LIFE)


def _end_setups(where):
    Session.update(totp_setup=None, totp_setup_at=None).where(where & Session.totp_setup.is_null(False)).execute()


def provisioning_uri(user, secret):
    return pyotp.TOTP(secret).provisioning_uri(name=user.username, issuer_name=ISSUER)


def qr_svg(uri):
    """The otpauth URI as an inline SVG QR code (no script, no external reference: the CSP holds)."""
    import segno  # by the set-up page only, not by every start

    return segno.make(uri, error="m").svg_inline(scale=4, dark="#000", light="#fff", title="QR code of the secret")


def matching_step(secret, code):
    """The time step (of those accepted around now) whose code this (normalised) code is, or None."""
    if not CODE_PATTERN.fullmatch(code):
        return None
    totp = pyotp.TOTP(secret, digits=DIGITS, interval=STEP_SECONDS)
    current = totp.timecode(datetime.datetime.now(datetime.UTC))
    for offset in STEPS_ACCEPTED:
        if hmac.compare_digest(totp.generate_otp(current + offset), code):
            return current + offset
    return None


def normalize(code):
    """A code as it is checked: spaces and dashes removed, upper case. A code is normalised once,
    where it enters (webprotection.submitted_code); the functions here take what this returns, so
    the throttle and the check always judge the same string."""
    return re.sub(r"[\s-]", "", code or "").upper()


def use_totp(user, code):
    """True when code (normalised) is a TOTP code of the account newer than the last one accepted,
    which it then becomes: a code is accepted once, by one request of any worker (compare-and-set
    on last_step)."""
    record = record_for(user)
    if record is None:
        return False
    secret = unseal(record.sealed_secret)
    step = matching_step(secret, code) if secret else None
    if step is None:
        return False
    return bool(TwoFactor.update(last_step=step)
                .where((TwoFactor.user == user.id) & (TwoFactor.last_step < step)).execute())


def enable(user, code, session):
    """Turn 2FA on once code (normalised) confirms the secret of the session's set-up; return the
    recovery codes (shown once)."""
    with db.atomic():
        users.lock_user(user)
        secret = setup_secret(session)
        if secret is None or record_for(user) is not None:
            raise ValueError(NO_SETUP)
        # Stored as the last step used: the confirming code cannot log in.
        step = matching_step(secret, code)
        if step is None:
            raise WrongCode("That code is not correct. Check the time on your device and try the next code.")
        TwoFactor.create(user=user.id, sealed_secret=seal(secret), enabled_at=utcnow(), last_step=step)
        _end_setups(Session.user == user.id)  # this one's and any other session's
        codes = new_recovery_codes(user)
        securitylog.record(user.id, "user.2fa_enabled")
    return codes


def new_recovery_codes(user):
    codes = [make_recovery_code() for _ in range(RECOVERY_CODES)]
    RecoveryCode.delete().where(RecoveryCode.user == user.id).execute()
    RecoveryCode.insert_many([{"user": user.id, "code_hash": recovery_hash(user.id, normalize(code))}
                              for code in codes]).execute()
    return codes


def make_recovery_code():
    text = "".join(secrets.choice(RECOVERY_ALPHABET) for _ in range(RECOVERY_CODE_CHARACTERS))
    return "-".join(text[i:i + 4] for i in range(0, RECOVERY_CODE_CHARACTERS, 4))


def recovery_hash(user_id, code):
    # The account's id in the hash: the same code in two accounts has two hashes.
    return hashlib.sha256(f"{user_id}:{code}".encode()).hexdigest()


def use_recovery_code(user, code):
    """True when code (normalised) is one of the account's unused recovery codes, which it then no
    longer is."""
    if len(code) != RECOVERY_CODE_CHARACTERS:
        return False
    used = (RecoveryCode.update(used_at=utcnow())
            .where((RecoveryCode.user == user.id) & (RecoveryCode.code_hash == recovery_hash(user.id, code))
                   & RecoveryCode.used_at.is_null())
            .execute())
    if used:
        securitylog.record(user.id, "user.recovery_code_used")
    return bool(used)


def use_code(user, code):
    """Check a second-factor code (normalised: TOTP or recovery code); raise WrongCode when it is neither."""
    if not (use_totp(user, code) or use_recovery_code(user, code)):
        if securitylog.failures_this_hour(user.id, "user.2fa_failed") < securitylog.FAILURES_RECORDED_PER_HOUR:
            securitylog.record(user.id, "user.2fa_failed")
        raise WrongCode("That code is not correct.")


def unused_recovery_codes(user):
    return RecoveryCode.select().where((RecoveryCode.user == user.id) & RecoveryCode.used_at.is_null()).count()


def turn_off(user):
    """Turn 2FA off (the caller checked the password and a code): the secret and the recovery
    codes are deleted. The account's other sessions stay (SECURITY.md says why)."""
    with db.atomic():
        TwoFactor.delete().where(TwoFactor.user == user.id).execute()
        RecoveryCode.delete().where(RecoveryCode.user == user.id).execute()
        securitylog.record(user.id, "user.2fa_disabled")


# The half-logged-in state: a row per browser between the password and the second factor.

def start_pending_login(user):
    """Remember that this user gave the right password; return the token for the cookie."""
    token = secrets.token_urlsafe(32)
    with db.atomic():
        PendingLogin.delete().where(PendingLogin.expires_at < utcnow()).execute()
        PendingLogin.create(token_hash=sessions.token_hash(token), user=user.id, password_hash=user.password_hash,
                            expires_at=utcnow() + PENDING_LOGIN_LIFE)
        # A right password is not throttled: keep what repeating it adds bounded.
        models.keep_newest(PendingLogin, PendingLogin.user == user.id, PendingLogin.expires_at,
                          PendingLogin.token_hash, PENDING_LOGINS_KEPT)
    return token


def find_pending_login(token):
    """The unexpired pending log-in of a cookie's token, with its user loaded, or None."""
    if not isinstance(token, str) or not token:
        return None
    return (PendingLogin.select(PendingLogin, User).join(User)
            .where((PendingLogin.token_hash == sessions.token_hash(token)) & (PendingLogin.expires_at >= utcnow()))
            .first())


def finish_pending_login(pending):
    """End the pending log-in; return its user with the password hash it was checked against (so
    that sessions.start_session refuses it when the password changed since), or None when another
    request finished it first."""
    if not PendingLogin.delete().where(PendingLogin.token_hash == pending.token_hash).execute():
        return None
    user = pending.user
    user.password_hash = pending.password_hash
    return user


def count_pending_failure(pending):
    """Count a wrong code against the pending log-in; end it after PENDING_LOGIN_FAILURES."""
    # Counted in the database: requests racing on one pending log-in each read the same count.
    this = PendingLogin.token_hash == pending.token_hash
    PendingLogin.update(failures=PendingLogin.failures + 1).where(this).execute()
    PendingLogin.delete().where(this & (PendingLogin.failures >= PENDING_LOGIN_FAILURES)).execute()
