"""The web application's views: sign-up and log-in, Profile Settings and the Security tab, two-factor log-in, passkeys,
the key page and the API reference page."""
