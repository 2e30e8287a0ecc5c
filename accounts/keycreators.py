"""GET /api/v1/user/me's answer: who created a key, and how many active keys they created in the
key's organisation, kept for each key while nothing is committed to the database (store/kept.py)
and until the soonest of those keys expires."""

from peewee import JOIN, fn

from models import ApiKey, User, db, epoch_of, iso_seconds
from ops import note as request_note
from store.kept import KeptAnswers

# Keys asked about between two commits (a worker's usage flush commits every second): an entry
# is a few hundred bytes.
SIZE = 10_000
GONE = {"user_id": None, "username": None, "email": None, "created_at": None, "api_key_count": 0}

kept = KeptAnswers(db, SIZE, request_note.data_versions)


def described(key):
    """The answer for an admitted key (a copy: the caller's to change), or None when the key has
    been deleted since it was admitted (with its organisation)."""
    answer = kept.get(key.id, lambda: read(key.id))
    return None if answer is None else dict(answer)


def read(key_id):
    """(the answer, or None for a deleted key; the epoch second from which its count may be lower,
    or None). The creator is None once that account is deleted: the key still works for its
    organisation."""
    row = (ApiKey.select(ApiKey.id, ApiKey.org, ApiKey.user, User).join(User, JOIN.LEFT_OUTER)
           .where(ApiKey.id == key_id).first())
    if row is None:
        return None, None
    if row.user_id is None:
        return GONE, None
    user = row.user
    active = ApiKey.active_in(row.org_id, created_by=user.id)
    count, soonest = (active.select(fn.COUNT(ApiKey.id), fn.MIN(ApiKey.expires_at)).order_by()
                      .tuples().first())
    answer = {"user_id": user.id, "username": user.username, "email": user.email,
              "created_at": iso_seconds(user.created_at), "api_key_count": count}
    return answer, None if soonest is None else epoch_of(ApiKey.expires_at.python_value(soonest))
