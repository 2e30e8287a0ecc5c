"""Organisation slugs: the name in lower case, each run of characters other than a-z0-9 one `-`,
without a leading or trailing `-` (CONTRACT.md, "Organisations"), unique."""

import re

MAX_SLUG_LENGTH = 64
NOT_SLUG = re.compile(r"[^a-z0-9]+")


def slug_of(name):
    return NOT_SLUG.sub("-", name.lower()).strip("-")[:MAX_SLUG_LENGTH].strip("-")


def first_free(name, taken):
    """slug_of(name), or with -2, -3 ... the first not in taken (a personal organisation's, whose
    name is a username that another slug may already hold)."""
    base = slug_of(name) or "org"
    suffix, slug = 1, base
    while slug in taken:
        suffix += 1
        slug = f"{base[:MAX_SLUG_LENGTH - len(str(suffix)) - 1].rstrip('-')}-{suffix}"
    return slug
