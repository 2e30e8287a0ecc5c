"""The web application's account protection: the Security tab's two-factor and passkey forms, the
log-in's second step, and log-in with a passkey."""

import datetime
import functools
import time

from flask import abort, current_app, flash, g, redirect, render_template, request, session, url_for
from limits import RateLimitItemPerMinute

import ratelimit
from accounts import passkeys, throttles, twofactor, users
from models import utcnow
from ops import clientaddress
from web import profile, security, signin
from web.hooks import login_required, page_blueprint

bp = page_blueprint("protection", __name__)

CEREMONY = "webauthn"  # the session cookie's key for the WebAuthn challenge's token
# Adding a second factor (TOTP or a passkey) needs a log-in this recent: a stolen session cookie
# must not become a passkey or an authenticator of the thief's, which would outlive a password
# change (that ends every session) and could lock the owner out.
RECENT_LOGIN = datetime.timedelta(minutes=15)
# Each ceremony stores a challenge (for CHALLENGE_LIFE): bounded per client address.
CEREMONIES_PER_IP = RateLimitItemPerMinute(30)



@bp.app_context_processor
def protection_context():
    """account_protection(): what templates/_two_factor.html shows, read only where it is included."""

    def account_protection():
        return {"enabled": twofactor.is_enabled(g.user), "passkeys": passkeys.owned(g.user),
                "recovery_codes_left": twofactor.unused_recovery_codes(g.user)}

    return {"account_protection": account_protection}


def recent_login_required(view):
    """Send a session older than RECENT_LOGIN to log in again (JSON callers get a 403)."""

    @functools.wraps(view)
    def wrapped(**kwargs):
        if utcnow() - g.session.created_at < RECENT_LOGIN:
            return view(**kwargs)
        message = "For your security, log in again to add a second factor: your log-in is older than 15 minutes."
        if request.is_json:
            return json_error(message, 403, "login_too_old")
        flash(message, "error")
        return redirect(url_for("signin.login", next=url_for("security.settings_security")))

    return wrapped


def code_identity(user):
    # Code guesses share the password throttle's windows under a name no username can take (':'
    # is not allowed in one): per account and address, per address, and the per-account slowdown.
    # TOTP and recovery codes count in the same windows, so switching between them gains nothing.
    return f"2fa:{user.id}"


def submitted_code():
    """The form's code, normalised: the one string the throttle and the check both judge, so that
    no way of writing a code (123-456, 123 456) is checked without being counted as what it is."""
    return twofactor.normalize(request.form.get("code", ""))


def check_code(user, code, check=twofactor.use_code):
    """Run check(user, code) (raising ValueError for a wrong code) under the throttle on a
    submitted_code; return (what check returned, None) when it passed, else (None, (flash, status))."""
    identity = code_identity(user)
    totp = bool(twofactor.CODE_PATTERN.fullmatch(code))
    try:
        time.sleep(throttles.password_attempt(identity))
        if totp:
            # Per address alone, many addresses would make 6 digits guessable within a day.
            throttles.count_totp_guess(user)
    except ratelimit.RateLimitExceeded as error:
        recovery = " A recovery code or a passkey still works." if totp and twofactor.is_enabled(user) else ""
        return None, (f"Too many wrong codes. Try again in {error.retry_after} seconds.{recovery}", 429)
    try:
        passed = check(user, code)
    except ValueError as error:  # a WrongCode, or a set-up to start again
        throttles.password_refused(identity)
        return None, (str(error), 400)
    throttles.password_accepted(identity)
    if totp:
        throttles.totp_guess_accepted(user)
    return passed, None


# The Security tab: TOTP.

@bp.route("/settings/security/2fa/setup", methods=("GET", "POST"))
@login_required
@recent_login_required
def setup():
    try:
        secret = twofactor.start_setup(g.user, g.session)
    except ValueError as error:
        flash(str(error), "error")
        return redirect(url_for("security.settings_security"))
    return render_setup(secret)


def render_setup(secret, status=200):
    uri = twofactor.provisioning_uri(g.user, secret)
    return render_template("two_factor_setup.html", secret=secret, uri=uri, qr=twofactor.qr_svg(uri)), status


@bp.post("/settings/security/2fa/enable")
@login_required
@recent_login_required
def enable():
    secret = twofactor.setup_secret(g.session)
    if secret is None:
        twofactor.end_setup(g.session)  # one past its life is discarded, not kept
        flash(twofactor.NO_SETUP, "error")
        return redirect(url_for("security.settings_security"))
    codes, refused = check_code(g.user, submitted_code(), functools.partial(twofactor.enable, session=g.session))
    if refused:
        flash(refused[0], "error")
        return render_setup(secret, refused[1])
    return render_template("two_factor_codes.html", codes=codes)


@bp.post("/settings/security/2fa/disable")
@login_required
def disable():
    if not twofactor.is_enabled(g.user):
        flash("Two-factor authentication is already off.", "error")
        return redirect(url_for("security.settings_security"))
    # The password under the password throttle (a stolen cookie cannot guess it), then the code
    # under the code throttle.
    username = g.user.username
    try:
        time.sleep(throttles.password_attempt(username))
    except ratelimit.RateLimitExceeded as error:
        flash(f"Too many wrong passwords. Try again in {error.retry_after} seconds.", "error")
        return security.render_security_tab(status=429)
    if not users.password_matches(g.user, request.form.get("password", "")):
        throttles.password_refused(username)
        flash("The password is not correct.", "error")
        return security.render_security_tab(status=400)
    throttles.password_accepted(username)
    _, refused = check_code(g.user, submitted_code())
    if refused:
        flash(refused[0], "error")
        return security.render_security_tab(status=refused[1])
    twofactor.turn_off(g.user)
    flash("Two-factor authentication is off. Your other sessions stay signed in.")
    return redirect(url_for("security.settings_security"))


# The Security tab: passkeys (JSON for static/passkeys.js).

def json_error(message, status=400, code="invalid_request"):
    return {"error": {"code": code, "message": message}}, status


@bp.post("/settings/security/passkeys/options")
@login_required
@recent_login_required
def passkey_registration_options():
    try:
        count_ceremony()
    except ratelimit.RateLimitExceeded as error:
        return json_error(f"Too many attempts. Try again in {error.retry_after} seconds.", 429, "rate_limit_exceeded")
    options, session[CEREMONY] = passkeys.registration_options(g.user)
    return options, 200, {"Content-Type": "application/json"}


@bp.post("/settings/security/passkeys")
@login_required
@recent_login_required
def add_passkey():
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return json_error("Send a JSON object with the passkey's name and credential.")
    try:
        passkey = passkeys.register(g.user, session.pop(CEREMONY, None), body.get("name"), body.get("credential"))
    except ValueError as error:
        return json_error(str(error))
    return {"id": passkey.id, "name": passkey.name}, 201


@bp.post("/settings/security/passkeys/<int(max=9223372036854775807):passkey_id>/remove")
@login_required
def remove_passkey(passkey_id):
    # The password, as for turning 2FA off: a stolen cookie alone must not remove the owner's
    # passkey and with it sign the owner out while the thief stays.
    refused = profile.refuse_wrong_password(request.form.get("password", ""))
    if refused:
        flash(refused[0], "error")
        return security.render_security_tab(status=refused[1])
    name = passkeys.remove(g.user, passkey_id, keep_session=g.session)
    if name is None:
        abort(404)
    flash(f"Removed the passkey {name!r}; every other session of this account is signed out.")
    return redirect(url_for("security.settings_security"))


# Log-in: the second step, and log-in with a passkey.

def pending_login():
    pending = twofactor.find_pending_login(session.get(signin.PENDING_LOGIN))
    if pending is None:
        session.pop(signin.PENDING_LOGIN, None)
    return pending


def finish_login(user):
    """Start the session of a log-in that passed; the page to go to, or None when it cannot start."""
    next_path = session.get(signin.LOGIN_NEXT)
    if user is None or not signin.log_in(user):
        return None
    return signin.local_path(next_path) or url_for("profile.settings_profile")


@bp.route("/login/2fa", methods=("GET", "POST"))
def second_factor():
    pending = pending_login()
    if pending is None:
        flash("Log in again: the log-in expired or was finished.", "error")
        return redirect(url_for("signin.login"))
    has_passkeys = bool(passkeys.owned(pending.user))
    if request.method == "GET":
        return render_template("login_2fa.html", has_passkeys=has_passkeys)
    _, refused = check_code(pending.user, submitted_code())
    if refused:
        twofactor.count_pending_failure(pending)
        flash(refused[0], "error")
        return render_template("login_2fa.html", has_passkeys=has_passkeys), refused[1]
    target = finish_login(twofactor.finish_pending_login(pending))
    if target is None:
        flash("Log in again: the log-in expired or was finished.", "error")
        return redirect(url_for("signin.login"))
    return redirect(target)


def count_ceremony():
    """Count a WebAuthn ceremony started from this client address (each stores a challenge)."""
    address = clientaddress.client_identity(request.remote_addr)
    current_app.extensions["ratelimit"].hit(CEREMONIES_PER_IP, f"webauthn-ip:{address}", "webauthn")


def ceremony_options(purpose, user=None):
    try:
        count_ceremony()
    except ratelimit.RateLimitExceeded as error:
        return json_error(f"Too many attempts. Try again in {error.retry_after} seconds.", 429, "rate_limit_exceeded")
    options, session[CEREMONY] = passkeys.authentication_options(purpose, user)
    return options, 200, {"Content-Type": "application/json"}


def credential_from_body():
    body = request.get_json(silent=True)
    return body.get("credential") if isinstance(body, dict) else None


@bp.post("/login/passkey/options")
def passkey_login_options():
    return ceremony_options(passkeys.LOGIN)


@bp.post("/login/passkey")
def passkey_login():
    try:
        user, passkey = passkeys.authenticate(session.pop(CEREMONY, None), passkeys.LOGIN, credential_from_body())
    except passkeys.PasskeyRefused as error:
        return json_error(str(error))
    return passkey_logged_in(user, passkey)


@bp.post("/login/2fa/passkey/options")
def passkey_second_factor_options():
    pending = pending_login()
    if pending is None:
        return json_error("Log in again: the log-in expired or was finished.")
    return ceremony_options(passkeys.SECOND_FACTOR, pending.user)


@bp.post("/login/2fa/passkey")
def passkey_second_factor():
    pending = pending_login()
    if pending is None:
        return json_error("Log in again: the log-in expired or was finished.")
    try:
        _, passkey = passkeys.authenticate(session.pop(CEREMONY, None), passkeys.SECOND_FACTOR,
                                           credential_from_body(), pending.user)
    except passkeys.PasskeyRefused as error:
        return json_error(str(error))
    return passkey_logged_in(twofactor.finish_pending_login(pending), passkey)


def passkey_logged_in(user, passkey):
    target = finish_login(user)
    if target is None:
        return json_error("Log in again: the log-in expired or was finished.")
    passkeys.record_login(user, passkey)
    return {"redirect": target}
