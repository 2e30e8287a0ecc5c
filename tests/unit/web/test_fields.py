"""Each form's refusals tied to the field they are about (web/fields.py), through Flask's test client:
sign-up, log-in, the reset link's form and the Profile tab's password, address and deletion forms
show the sentence under that field, mark it invalid, describe it with the sentence and focus it
(no other field); and the hint under every new password's field names each rule the server applies."""

import pytest
from webforms import Fields, page

from accounts import recovery, users
from models import Membership
from orgs import members as org_members

PASSWORD = "correct horse battery"  # conftest's alice
# An example each rule of users.check_new_password refuses, and the words of the hint that name it.
RULES = [("seven77", "8 to"), ("x" * 1025, "1,024 characters"),
         ("iloveyou", "not one of the most common passwords"), ("ILoveYou", "capital letters make no difference"),
         ("tab\there-password", "no control or invisible characters")]


@pytest.fixture
def app(make_app, database_url, smtp):
    """The conftest app's settings, with mail on (the Profile tab shows its address form then)."""
    app = make_app({"DATABASE_URL": database_url, "RATELIMIT_STORAGE_URL": "memory://", "TESTING": True,
                    "WTF_CSRF_ENABLED": False, "MAIL_URL": smtp.url})
    with app.app_context():
        yield app


def fields(response, status=400):
    assert response.status_code == status
    return Fields(page(response))


def reset_path(user):
    """The path of a new reset link of the user's account."""
    tokens = []
    assert recovery.request_reset(user.email, lambda _, token: tokens.append(token))
    return f"/password/reset/{tokens[0]}"


def assert_refused(form, sentence, field_id, *also_invalid, focus=None):
    """The sentence shown once, tied to field_id (and also_invalid), the focus on `focus` (else field_id) alone."""
    assert " ".join(form.texts["field-error"].split()) == sentence
    assert sorted(form.invalid()) == sorted([field_id, *also_invalid])
    for invalid in [field_id, *also_invalid]:
        assert form.description(invalid).startswith(sentence)
    assert form.focused() == [focus or field_id]


@pytest.mark.parametrize("where", ["signup", "reset", "profile"])
def test_every_new_password_hint_names_each_rule_the_server_applies_in_one_sentence(app, client, user, where):
    if where == "profile":
        client.post("/login", data={"username": "alice", "password": PASSWORD})
    path, field_id = {"signup": ("/signup", "password"), "reset": (reset_path(user), "new_password"),
                      "profile": ("/settings/profile", "new-password")}[where]
    hint = fields(client.get(path), 200).description(field_id)
    [rules] = [sentence for sentence in hint.split(". ") if "characters" in sentence]
    for password, words in RULES:
        with pytest.raises(ValueError):
            users.check_new_password(password)
        assert words in rules, (password, hint)


def test_a_fresh_form_marks_nothing_and_focuses_its_first_field(client):
    for path, first in [("/signup", "username"), ("/login", "username")]:
        form = fields(client.get(path), 200)
        assert form.invalid() == [] and form.focused() == [first] and "field-error" not in form.texts


@pytest.mark.parametrize("data, sentence, field_id, also", [
    ({"username": "b"}, "A username is 3 to 32 letters, digits, dots, dashes or underscores.", "username", ()),
    ({"email": "not-an-address"}, "That does not look like an email address.", "email", ()),
    ({"email": "bob@exa\u200bmple.com"}, "An email address cannot contain control characters (such as NUL, tabs or "
     "line breaks) or invisible formatting characters.", "email", ()),
    ({"password": "iloveyou"}, "That password is one of the most common passwords; choose another.", "password", ()),
    ({"password": "short"}, "A password needs at least 8 characters.", "password", ()),
    ({"username": "alice"}, "That username or email cannot be used. Choose another, or log in.", "username",
     ("email",)),
])
def test_a_signup_refusal_is_tied_to_its_field_and_focuses_it(client, user, data, sentence, field_id, also):
    sent = {"username": "bob", "email": "bob@example.com", "password": "long enough pass", **data}
    form = fields(client.post("/signup", data=sent))
    assert_refused(form, sentence, field_id, *also)
    assert form.inputs["username"]["value"] == sent["username"] and "value" not in form.inputs["password"]


@pytest.mark.parametrize("data", [{"password": "wrong password"}, {"username": "nobody"},
                                  {"password": "nul\x00password"}])
def test_a_refused_login_is_tied_to_both_fields_and_focuses_the_password(client, user, data):
    form = fields(client.post("/login", data={"username": "alice", "password": PASSWORD, **data}))
    sentence = " ".join(form.texts["field-error"].split())
    assert sentence in ("The username or password is incorrect.", "A username or password cannot contain control "
                        "characters (such as NUL, tabs or line breaks) or invisible formatting characters.")
    assert_refused(form, sentence, "password", "username")


@pytest.mark.parametrize("path, data, sentence, field_id", [
    ("/settings/profile/password", {"current_password": "wrong password", "new_password": "long enough pass"},
     "The current password is not correct.", "current-password"),
    ("/settings/profile/password", {"current_password": PASSWORD, "new_password": "iloveyou"},
     "That password is one of the most common passwords; choose another.", "new-password"),
    ("/settings/profile/email", {"password": "wrong password", "email": "new@example.com"},
     "The password is not correct.", "email-password"),
    ("/settings/profile/email", {"password": PASSWORD, "email": "not-an-address"},
     "That does not look like an email address.", "new-email"),
    ("/settings/profile/email", {"password": PASSWORD, "email": "alice@example.com"},
     "That is already your address.", "new-email"),
    ("/settings/profile/delete", {"password": "wrong password"}, "The password is not correct.", "delete-password"),
])
def test_a_profile_refusal_is_tied_to_its_field_and_focuses_it(logged_in, path, data, sentence, field_id):
    form = fields(logged_in.post(path, data=data))
    assert_refused(form, sentence, field_id)
    assert field_id not in form.folded  # the deletion's form opens to show it
    if path.endswith("/email"):  # the address typed is kept, the password never
        assert form.inputs["new-email"]["value"] == data["email"] and "value" not in form.inputs["email-password"]


def test_the_profile_tab_focuses_nothing_and_folds_the_deletion_away_until_a_refusal(logged_in):
    form = fields(logged_in.get("/settings/profile"), 200)
    assert form.focused() == [] and form.invalid() == [] and "delete-password" in form.folded


def test_a_reset_refusal_is_tied_to_its_field_and_focuses_it(client, user):
    path = reset_path(user)
    form = fields(client.post(path, data={"new_password": "iloveyou", "repeat_new_password": "iloveyou"}))
    assert_refused(form, "That password is one of the most common passwords; choose another.", "new_password")


def test_a_refusal_about_no_field_is_the_pages_error_and_marks_none(logged_in, user):
    # The only owner of an organisation with another member cannot delete the account: no field is wrong.
    org = org_members.create("Acme", user)
    Membership.create(org=org.id, user=users.create_user("bob", "bob@example.com", PASSWORD).id, role="developer")
    response = logged_in.post("/settings/profile/delete", data={"password": PASSWORD})
    form = fields(response)
    assert form.invalid() == [] and form.focused() == [] and "field-error" not in form.texts
    assert '<p class="flash error" role="alert">' in page(response) and "delete-password" in form.folded
