"""A refusal of what someone typed: the sentence to show and the field it is about, so that a form
can tie the one to the other."""


class Refused(ValueError):
    """A value the account rules refuse: str() is the sentence; .field names the field ("username",
    "email" or "password"), or is None when the value was no field of the account."""

    def __init__(self, sentence, field=None):
        super().__init__(sentence)
        self.field = field
