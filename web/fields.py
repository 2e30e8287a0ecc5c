"""What a form's fields say on the page: a refusal tied to the field it is about (shown under it,
marked with aria-invalid and aria-describedby, and focused, all without a script), and the rules of
a new password in one sentence."""

from flask import flash, g
from markupsafe import Markup, escape

from accounts import users

ERROR_ID = "field-error"
# Every rule of accounts/users.py's check_new_password, for the hint under each new password's field.
PASSWORD_RULES = (f"{users.MIN_PASSWORD_LENGTH} to {users.MAX_PASSWORD_LENGTH:,} characters, not one of the most "
                  "common passwords (capital letters make no difference), and no control or invisible characters.")


def refuse(sentence, *field_ids, focus=None):
    """Have the page show sentence under the field with the first id, tied to every field named, and
    put the focus on the field `focus` (else the first); with no id (None counts as none), as the
    page's error at the top."""
    field_ids = tuple(field_id for field_id in field_ids if field_id)
    if field_ids:
        g.field_error = (sentence, field_ids, focus or field_ids[0])
    else:
        flash(sentence, "error")


def field(field_id, hint=None, autofocus=False):
    """An input's id and ARIA attributes: described by the refusal about it (then marked invalid) and
    by its hint (an id); focused when the refusal says so, or with autofocus when there is none."""
    _, invalid, focus = g.get("field_error") or (None, (), None)
    described = ([ERROR_ID] if field_id in invalid else []) + ([hint] if hint else [])
    attributes = [f'id="{escape(field_id)}"']
    if field_id in invalid:
        attributes.append('aria-invalid="true"')
    if described:
        attributes.append(f'aria-describedby="{escape(" ".join(described))}"')
    if field_id == focus or (autofocus and focus is None):
        attributes.append("autofocus")
    return Markup(" ".join(attributes))


def field_error(field_id):
    """The refusal's sentence, when it is shown under this field; else nothing."""
    error = g.get("field_error")
    if error is None or error[1][0] != field_id:
        return ""
    return Markup('<p class="flash error field-error" id="{}">{}</p>').format(ERROR_ID, error[0])


def is_invalid(field_id):
    """Whether the refusal is about this field (a form folded away opens to show it)."""
    return field_id in (g.get("field_error") or (None, ()))[1]


def template_helpers():
    return {"field": field, "field_error": field_error, "is_invalid": is_invalid, "password_rules": PASSWORD_RULES,
            "min_password_length": users.MIN_PASSWORD_LENGTH}
