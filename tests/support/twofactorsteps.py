"""Two-factor log-in's steps through Flask's test client, and the TOTP code of any step."""

import re
import time

import pyotp

# RFC 6238's step, the one the service uses.
STEP_SECONDS = 30


def code_at(secret, offset=0):
    """The TOTP code of the step offset steps from now."""
    return pyotp.TOTP(secret).at(time.time() + offset * STEP_SECONDS)


def start_setup(client):
    """Start the set-up in the logged-in client; return the secret its page shows."""
    page = client.post("/settings/security/2fa/setup").get_data(as_text=True)
    assert "<svg" in page
    return re.search(r'data-totp-secret="([A-Z2-7]+)"', page)[1]


def confirm(client, code):
    return client.post("/settings/security/2fa/enable", data={"code": code})


def enable(client):
    """Turn 2FA on for the logged-in client; return (secret, recovery codes)."""
    secret = start_setup(client)
    page = confirm(client, code_at(secret)).get_data(as_text=True)
    return secret, re.findall(r'class="recovery-code">([A-Z2-7-]+)<', page)


def is_logged_in(client):
    return client.get("/settings/profile").status_code == 200
