"""The web application: pages, accounts, two-factor log-in, passkeys, the key page and the API reference page."""
