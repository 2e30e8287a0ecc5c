"""The web application through Flask's test client: a page's text, and a key made on the Security tab."""

import re

SECRET_PATTERN = re.compile(r'id="new-secret"[^>]*>(sk_(?:live|test)_[A-Za-z0-9]+)<')


def page(response):
    return response.get_data(as_text=True)


def create_key(client, name="Web key", key_type="production"):
    """Create a key through the Security tab; return the secret the page shows once."""
    response = client.post("/settings/security/keys", data={"name": name, "type": key_type})
    assert response.status_code == 302
    assert response.headers["Location"] == "/settings/security"
    html = page(client.get("/settings/security"))
    assert "This is the only time the secret is shown" in html and 'id="copy-secret"' in html
    return SECRET_PATTERN.search(html)[1]
