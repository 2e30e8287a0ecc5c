"""The tokens of mailed links: their shape, which the log leaves whole inside a link."""

from accounts import emailtokens
from ops import logs


def test_a_token_has_the_pattern_and_no_run_the_log_takes_for_an_api_keys_body():
    tokens = {emailtokens.new_token() for _ in range(2000)}
    assert len(tokens) == 2000
    for token in tokens:
        assert emailtokens.TOKEN_PATTERN.fullmatch(token)
        line = f"Mail to bob@example.com | https://api.example.com/email/verify/{token}"
        assert logs.redact(line) == line
