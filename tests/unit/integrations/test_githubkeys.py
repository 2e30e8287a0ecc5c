"""GitHub's secret-scanning keys: GitHub's own published samples verify (and nothing altered does),
the keys document is parsed strictly, kept 30 minutes, read again for an unknown identifier at most
once a minute by one caller at a time, and read within a bounded time and size from a server that
is slow, huge, failing, dripping or away."""

import json
import threading
import time

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from githubscanning import SAMPLES, Signer, serving_keys
from liveserver import free_port

from integrations import github, githubkeys
from integrations.githubkeys import GitHubKeys, KeysUnavailable, KeysUnreadable, parse_keys, signature_holds


def sample_key(name):
    return parse_keys(json.dumps({"public_keys": [{"key_identifier": SAMPLES[name]["key_identifier"],
                                                   "key": SAMPLES[name]["key"], "is_current": True}]}))


@pytest.mark.parametrize("name", ["current", "earlier"])
def test_githubs_published_samples_verify(name):
    sample = SAMPLES[name]
    key = sample_key(name)[sample["key_identifier"]]
    assert signature_holds(key, sample["payload"].encode(), sample["signature"])


@pytest.mark.parametrize("name", ["current", "earlier"])
def test_a_sample_altered_by_one_byte_or_checked_with_another_key_fails(name):
    sample = SAMPLES[name]
    key = sample_key(name)[sample["key_identifier"]]
    payload = sample["payload"].encode()
    assert not signature_holds(key, payload.replace(b"token", b"tokem", 1), sample["signature"])
    assert not signature_holds(key, payload + b"\n", sample["signature"])
    other = "earlier" if name == "current" else "current"
    assert not signature_holds(sample_key(other)[SAMPLES[other]["key_identifier"]], payload, sample["signature"])
    assert not signature_holds(key, payload, SAMPLES[other]["signature"])


@pytest.mark.parametrize("signature", ["", "not base64!", "QUJD", "A" * 200,
                                       "MEQCIAfgjgz6Ou/3DXMYZBervz1TKCHFsvwMcbuJhNZ"])
def test_a_malformed_signature_is_simply_false(signature):
    sample = SAMPLES["current"]
    key = sample_key("current")[sample["key_identifier"]]
    assert signature_holds(key, sample["payload"].encode(), signature) is False


def pem(public_key):
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def test_only_p256_keys_are_kept_and_a_document_without_one_is_unreadable():
    good = Signer("good")
    entries = [good.entry(current=False),
               {"key_identifier": "p384", "key": pem(ec.generate_private_key(ec.SECP384R1()).public_key())},
               {"key_identifier": "rsa", "key": pem(rsa.generate_private_key(65537, 2048).public_key())},
               {"key_identifier": "garbage", "key": "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n"},
               {"key_identifier": 7, "key": good.public_pem()}, "a string", None]
    assert set(parse_keys(json.dumps({"public_keys": entries}))) == {"good"}
    for document in [b"", b"not json", b"[]", b'{"public_keys": {}}', b'{"public_keys": []}',
                     json.dumps({"public_keys": entries[1:]}).encode(), b"[" * 100_000]:
        with pytest.raises(KeysUnreadable):
            parse_keys(document)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Reads:
    """A stand-in for read_document: counts its calls, answers with the signers' document, or fails."""

    def __init__(self, *signers, pause=0):
        self.signers = list(signers)
        self.calls = 0
        self.failing = False
        self.pause = pause
        self.lock = threading.Lock()

    def __call__(self, url, etag=None):
        with self.lock:
            self.calls += 1
        time.sleep(self.pause)
        if self.failing:
            raise KeysUnreadable("it answered HTTP 500")
        return json.dumps({"public_keys": [signer.entry() for signer in self.signers]}).encode(), None


def test_keys_are_kept_30_minutes_and_an_unknown_identifier_reads_again_at_most_once_a_minute():
    first, second = Signer("first"), Signer("second")
    reads, clock = Reads(first), Clock()
    keys = GitHubKeys("http://keys.invalid/", read=reads, clock=clock)
    assert keys.key_for("first") is not None and reads.calls == 1
    clock.now += 29 * 60
    assert keys.key_for("first") is not None and reads.calls == 1
    # Unknown: one read, then none for a minute, however often it is asked.
    assert keys.key_for("forged") is None and reads.calls == 2
    for _ in range(50):
        assert keys.key_for("forged") is None
    clock.now += 59
    assert keys.key_for("forged") is None and reads.calls == 2
    # GitHub adds a key: seen once a minute has passed.
    reads.signers.append(second)
    assert keys.key_for("second") is None and reads.calls == 2
    clock.now += 1
    assert keys.key_for("second") is not None and reads.calls == 3
    clock.now += 30 * 60
    assert keys.key_for("first") is not None and reads.calls == 4


def test_a_kept_key_still_verifies_while_the_keys_cannot_be_read_and_an_unknown_one_is_unavailable():
    signer = Signer("kept")
    reads, clock = Reads(signer), Clock()
    keys = GitHubKeys("http://keys.invalid/", read=reads, clock=clock)
    assert keys.key_for("kept") is not None
    reads.failing = True
    clock.now += 31 * 60
    assert keys.key_for("kept") is not None and reads.calls == 2
    with pytest.raises(KeysUnavailable):
        keys.key_for("other")
    # The failed read counts against the minute: no third read yet.
    assert reads.calls == 2
    clock.now += 60
    with pytest.raises(KeysUnavailable):
        keys.key_for("other")
    assert reads.calls == 3
    reads.failing = False
    clock.now += 60
    assert keys.key_for("other") is None and keys.key_for("kept") is not None and reads.calls == 4


def test_nothing_kept_and_unreadable_is_unavailable_not_unknown():
    reads = Reads()
    reads.failing = True
    keys = GitHubKeys("http://keys.invalid/", read=reads, clock=Clock())
    with pytest.raises(KeysUnavailable):
        keys.key_for("any")


def test_an_unchanged_document_keeps_the_keys():
    signer = Signer("kept")
    clock = Clock()
    answers = [(json.dumps({"public_keys": [signer.entry()]}).encode(), '"v1"'), None]
    etags = []

    def read(url, etag=None):
        etags.append(etag)
        return answers.pop(0)

    keys = GitHubKeys("http://keys.invalid/", read=read, clock=clock)
    assert keys.key_for("kept") is not None
    clock.now += 31 * 60
    assert keys.key_for("kept") is not None and etags == [None, '"v1"'] and keys.fresh()


def test_concurrent_requests_for_an_unknown_identifier_read_the_keys_once_and_all_wait_for_it():
    reads = Reads(Signer("real"), pause=0.3)
    keys = GitHubKeys("http://keys.invalid/", read=reads)
    assert keys.key_for("real") is not None and reads.calls == 1
    keys.tried_at -= 120  # a read is due for an unknown identifier
    reads.signers.append(Signer("new"))  # which GitHub has just added
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(keys.key_for("new"))) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == 20 and None not in answers and reads.calls == 2


def test_the_document_is_read_over_http():
    signer = Signer("served")
    with serving_keys(signer) as keys:
        body, _ = githubkeys.read_document(keys.url)
        assert set(parse_keys(body)) == {"served"}
        assert keys.read_count() == 1


@pytest.mark.parametrize("answer, reason", [
    (lambda handler: (500, b"{}"), "HTTP 500"),
    (lambda handler: (302, b""), "HTTP 302"),
    (lambda handler: (200, b"x" * (githubkeys.MAX_DOCUMENT_BYTES + 1)), "larger than 65536 bytes"),
], ids=["failing", "redirecting", "huge"])
def test_a_failing_redirecting_or_huge_answer_is_unreadable(answer, reason):
    with serving_keys(Signer("served")) as keys:
        keys.answer = answer
        with pytest.raises(KeysUnreadable, match=reason):
            githubkeys.read_document(keys.url)


@pytest.mark.parametrize("behaviour", ["silent", "dripping head", "dripping body, then close", "HTTP/1.0 dripping"])
def test_a_silent_or_dripping_server_is_cut_off_at_the_deadline(monkeypatch, behaviour):
    monkeypatch.setattr(githubkeys, "READ_SECONDS", 1.5)
    with serving_keys(Signer("served")) as keys:
        keys.answer = {"silent": lambda handler: None, "dripping head": keys.drip,
                       "dripping body, then close": keys.drip_body,
                       "HTTP/1.0 dripping": lambda handler: keys.drip_body(handler, "HTTP/1.0")}[behaviour]
        started = time.monotonic()
        with pytest.raises(KeysUnreadable, match="longer than 1.5 s"):
            githubkeys.read_document(keys.url)
        # The deadline, with a margin for a loaded machine; a drip would otherwise last for ever.
        assert time.monotonic() - started < 6


def test_an_endless_body_ended_by_the_connection_is_cut_at_the_size_limit():
    with serving_keys(Signer("served")) as keys:
        keys.answer = keys.flood
        with pytest.raises(KeysUnreadable, match="larger than 65536 bytes"):
            githubkeys.read_document(keys.url)


def test_a_report_waiting_for_a_read_that_never_ends_is_let_go_at_that_reads_deadline(monkeypatch):
    monkeypatch.setattr(githubkeys, "READ_SECONDS", 1)
    reads = Reads(Signer("real"))
    keys = GitHubKeys("http://keys.invalid/", read=reads)
    assert keys.key_for("real") is not None
    keys.tried_at -= 120
    reads.pause = 4  # a read stuck past every deadline, whatever the cause
    reader = threading.Thread(target=keys.key_for, args=("new",))
    reader.start()
    try:
        while reads.calls < 2:
            time.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(KeysUnavailable):
            keys.key_for("other")
        # Let go when the read under way reached its deadline, 1 s after it began: never later.
        assert 0.5 < time.monotonic() - started < 1.5
        keys.read_at -= githubkeys.KEPT_FOR  # a kept key past its 30 minutes still verifies meanwhile
        assert keys.key_for("real") is not None
    finally:
        reader.join(timeout=15)


def test_an_address_nobody_listens_on_is_unreadable_at_once():
    started = time.monotonic()
    with pytest.raises(KeysUnreadable, match="ConnectionRefusedError"):
        githubkeys.read_document(f"http://127.0.0.1:{free_port()}/keys")
    assert time.monotonic() - started < 3


def test_the_log_names_the_keys_host_only(caplog):
    reads = Reads()
    reads.failing = True
    keys = GitHubKeys("https://reader:s3cr3t-token@keys.example.com/keys?token=abc", read=reads)
    with pytest.raises(KeysUnavailable):
        keys.key_for("any")
    assert "https://keys.example.com" in caplog.text
    assert "s3cr3t" not in caplog.text and "abc" not in caplog.text


def test_the_keys_module_reads_with_bounds_github_sets():
    assert (githubkeys.KEPT_FOR, githubkeys.READ_AGAIN_AFTER) == (30 * 60, 60)
    assert githubkeys.READ_SECONDS <= 5 and github.MAX_REPORT_BYTES == 1024 * 1024 and github.MAX_ENTRIES == 1000
