"""The mail outbox and its sender, through a real SMTP server: a mail written in its cause's
transaction, sent once, retried on the schedule while the server is down, given up after it, and
never lost by a stop."""

import datetime
import logging

import pytest
from mailserver import free_port

from mail import outbox, sender
from mail.models import FAILED, PENDING, SENT, MailMessage
from models import db, utcnow
from settings.mail import MailServer


@pytest.fixture
def mail_app(make_app, database_url, smtp):
    app = make_app({"DATABASE_URL": database_url, "MAIL_URL": smtp.url, "TESTING": True,
                    "MAIL_FROM": "Demo <no-reply@example.com>", "PUBLIC_URL": "https://api.example.com"})
    with app.app_context():
        yield app


def make_due(row):
    (MailMessage.update(next_attempt_at=utcnow() - datetime.timedelta(seconds=1))
     .where(MailMessage.id == row.id).execute())


def test_a_queued_mail_is_sent_once_with_a_text_and_an_html_part(mail_app, smtp):
    with db.atomic():
        row = outbox.queue("bob@example.com", "test", server="smtp://test")
    assert [(mail.id, state) for mail, state in sender.send_due(mail_app)] == [(row.id, SENT)]
    [mail] = smtp.wait_for(1)
    assert mail.rcpt_tos == ["bob@example.com"] and mail.mail_from == "no-reply@example.com"
    assert mail.subject == "A test mail" and str(mail.message["From"]) == "Demo <no-reply@example.com>"
    assert mail.message["Message-ID"] == row.message_id and mail.message["Auto-Submitted"] == "auto-generated"
    assert "if it reached you, mail works" in mail.text and "<p>" in mail.html
    stored = MailMessage.get_by_id(row.id)
    assert (stored.state, stored.attempts, stored.sealed_parts, stored.next_attempt_at) == (SENT, 1, "", None)
    assert sender.send_due(mail_app) == []
    assert len(smtp.mails) == 1


def test_a_mail_is_written_only_with_its_cause(mail_app):
    with pytest.raises(RuntimeError), db.atomic():
        outbox.queue("bob@example.com", "test", server="x")
        raise RuntimeError("the cause did not commit")
    assert MailMessage.select().count() == 0


def test_the_database_holds_no_link_in_the_clear(mail_app):
    token = "Tok3n-that-must-never-be-stored-in-the-clear"
    row = outbox.queue("bob@example.com", "password_reset", link=f"https://x/password/reset/{token}", username="bob")
    raw = db.execute_sql("SELECT * FROM mail_messages WHERE id = %s" % int(row.id)).fetchone()
    assert not any(token in str(value) for value in raw)
    assert token in outbox.parts_of(MailMessage.get_by_id(row.id))["text"]


def test_a_server_that_is_down_delays_a_mail_on_the_schedule_and_loses_nothing(mail_app, smtp):
    smtp.stop()
    row = outbox.queue("bob@example.com", "test", server="x")
    before = utcnow()
    [(_, state)] = sender.send_due(mail_app)
    failed = MailMessage.get_by_id(row.id)
    assert (state, failed.attempts, failed.error) == (PENDING, 1, "The mail server refused the connection.")
    # MAIL_RETRY_SCHEDULE's first pause is 5 s.
    assert before + datetime.timedelta(seconds=4) <= failed.next_attempt_at <= utcnow() + datetime.timedelta(seconds=5)
    assert sender.send_due(mail_app) == []  # not due yet
    smtp.start()
    make_due(row)
    assert [state for _, state in sender.send_due(mail_app)] == [SENT]
    assert [mail.to for mail in smtp.wait_for(1)] == ["bob@example.com"]


def test_a_refused_recipient_is_retried_with_the_servers_answer(mail_app, smtp):
    smtp.refuse_with = "451 4.3.0 Try again later"
    row = outbox.queue("bob@example.com", "test", server="x")
    sender.send_due(mail_app)
    assert MailMessage.get_by_id(row.id).error == "451 4.3.0 Try again later"


def test_a_mail_is_given_up_and_logged_once_the_schedule_is_spent(make_app, database_url, caplog):
    app = make_app({"DATABASE_URL": database_url, "MAIL_URL": f"smtp://127.0.0.1:{free_port()}",
                    "MAIL_RETRY_SCHEDULE": "1s"})
    with app.app_context():
        row = outbox.queue("bob@example.com", "test", server="x")
        sender.send_due(app)
        make_due(row)
        with caplog.at_level(logging.WARNING, logger="mail.sender"):
            [(_, state)] = sender.send_due(app)
        gone = MailMessage.get_by_id(row.id)
    assert (state, gone.state, gone.attempts, gone.sealed_parts) == (FAILED, FAILED, 2, "")
    assert "Gave up sending the mail 'A test mail' to bob@example.com after 2 attempts" in caplog.text


def test_a_stop_gives_back_the_mails_it_cut(mail_app):
    row = outbox.queue("bob@example.com", "test", server="x")
    [claimed] = sender.claim(4)
    assert MailMessage.get_by_id(row.id).next_attempt_at > utcnow() + datetime.timedelta(seconds=60)
    service = sender.Sender(mail_app, [5])
    service.in_flight[claimed.id] = claimed
    service.close()
    given_back = MailMessage.get_by_id(row.id)
    assert (given_back.state, given_back.attempts) == (PENDING, 0)
    assert given_back.next_attempt_at <= utcnow()


def test_a_mail_that_cannot_be_made_is_a_failed_attempt_never_a_loop(mail_app, smtp):
    """Whatever goes wrong in an attempt (here an address written before the outbox checked it) is
    recorded and follows the schedule: the row is never left to its lease, claimed again forever."""
    row = outbox.queue("bob@example.com", "test", server="x")
    MailMessage.update(recipient="bücher@example.com").where(MailMessage.id == row.id).execute()
    [(_, state)] = sender.send_due(mail_app)
    failed = MailMessage.get_by_id(row.id)
    assert (state, failed.attempts) == (PENDING, 1) and failed.error
    assert failed.next_attempt_at <= utcnow() + datetime.timedelta(seconds=5)
    assert smtp.mails == []


def test_old_mails_are_forgotten_but_waiting_ones_kept(mail_app):
    old = utcnow() - sender.KEPT_FOR - datetime.timedelta(minutes=1)
    sent = outbox.queue("a@example.com", "test", server="x")
    waiting = outbox.queue("b@example.com", "test", server="x")
    MailMessage.update(created_at=old, state=SENT).where(MailMessage.id == sent.id).execute()
    MailMessage.update(created_at=old).where(MailMessage.id == waiting.id).execute()
    assert sender.forget_old() == 1
    assert [row.id for row in MailMessage.select()] == [waiting.id]


def test_mail_off_writes_nothing(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url, "MAIL_URL": "off"})
    with app.app_context():
        assert outbox.queue("bob@example.com", "test", server="x") is None
        assert MailMessage.select().count() == 0


@pytest.mark.parametrize("address", ["bob@example.com\r\nBcc: eve@example.com", "Eve <eve@example.com>",
                                     "bücher@example.com", "bob@exämple.com", "=?utf-8?q?a=0d=0a?=@example.com",
                                     "a@b.c, eve@example.com", "bob\n@example.com", "x" * 300 + "@example.com"])
def test_an_address_no_header_may_carry_is_refused(mail_app, address):
    with pytest.raises(ValueError):
        outbox.queue(address, "test", server="x")
    assert MailMessage.select().count() == 0


def test_links_use_public_url_and_never_the_requests_host(mail_app):
    with mail_app.test_request_context("/", headers={"Host": "evil.example"}):
        assert outbox.link("/password/reset/abc") == "https://api.example.com/password/reset/abc"


def test_links_outside_a_request_need_public_url(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url})
    with app.app_context():
        assert outbox.link("/x") is None
    with app.test_request_context("/", base_url="http://localhost:5000"):
        assert outbox.link("/x") == "http://localhost:5000/x"


def test_starttls_is_required_for_a_host_that_is_not_loopback(smtp, app):
    class Remote(MailServer):
        loopback = False

    server = Remote("smtp", "127.0.0.1", smtp.port)
    row = MailMessage(recipient="bob@example.com", subject="s", message_id="<1@x>")
    with pytest.raises(sender.transport.MailFailed, match="does not offer STARTTLS"):
        sender.transport.send(server, outbox.message_of(row, "a@example.com", {"text": "t", "html": "<p>t</p>"}))
    assert smtp.mails == []


def self_signed_context(tmp_path):
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mail.example.com")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                   .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    return context


def test_starttls_checks_the_servers_certificate(app, tmp_path):
    from aiosmtpd.controller import Controller

    class Remote(MailServer):
        loopback = False

    class Keep:
        async def handle_DATA(self, server, session, envelope):
            return "250 OK"

    port = free_port()
    controller = Controller(Keep(), hostname="127.0.0.1", port=port, tls_context=self_signed_context(tmp_path),
                            require_starttls=True)
    controller.start()
    try:
        row = MailMessage(recipient="bob@example.com", subject="s", message_id="<1@x>")
        message = outbox.message_of(row, "a@example.com", {"text": "t", "html": "<p>t</p>"})
        with pytest.raises(sender.transport.MailFailed, match="TLS failed: CERTIFICATE_VERIFY_FAILED"):
            sender.transport.send(Remote("smtp", "127.0.0.1", port), message)
    finally:
        controller.stop()
