"""Key events: the one signal a change to an API key sends inside its transaction, to which the
security log and webhooks subscribe, and the data every key event's webhook starts with."""

from blinker import Namespace

signals = Namespace()
# Sent by the change's own code inside its transaction (sender: the event's name, key.created ...),
# with user_id (the key's owner), detail (the owner's security-log line; None: the log does not
# record this event) and data (the webhook event's data, for the events webhooks send). Receivers
# run synchronously and write in that transaction: the change never commits without their rows.
key_changed = signals.signal("key-changed")


def key_data(key, **more):
    """The data every key event starts with: the key as `keys list` names it, never its secret."""
    return {"key_id": key.id, "key_name": key.name, "key_prefix": key.display_prefix, **more}
