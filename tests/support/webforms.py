"""The web application through Flask's test client: a page's text, a key made on the Security tab,
and a form's fields as a browser and a screen reader find them."""

import re
from html.parser import HTMLParser

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


class Fields(HTMLParser):
    """A page's inputs by id (their attributes, None for a bare one such as autofocus), the text of
    every other element that has an id, and the ids of the inputs folded away in a closed <details>."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, html):
        super().__init__()
        self.inputs, self.texts, self.folded, self.within = {}, {}, set(), []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "input" and "id" in attrs:
            self.inputs[attrs["id"]] = attrs
            if any(closed for _, _, closed in self.within):
                self.folded.add(attrs["id"])
        if tag not in self.VOID:
            self.within.append((tag, attrs.get("id"), tag == "details" and "open" not in attrs))
            if attrs.get("id"):
                self.texts[attrs["id"]] = ""

    def handle_endtag(self, tag):
        while self.within and self.within.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for _, element_id, _ in self.within:
            if element_id:
                self.texts[element_id] += data

    def description(self, field_id):
        """The texts that describe the input (its aria-describedby), each with its spaces made one."""
        ids = (self.inputs[field_id].get("aria-describedby") or "").split()
        return " ".join(" ".join(self.texts[element_id].split()) for element_id in ids)

    def focused(self):
        """The ids of the inputs with autofocus (a browser focuses the first)."""
        return [field_id for field_id, attrs in self.inputs.items() if "autofocus" in attrs]

    def invalid(self):
        return [field_id for field_id, attrs in self.inputs.items() if attrs.get("aria-invalid") == "true"]
