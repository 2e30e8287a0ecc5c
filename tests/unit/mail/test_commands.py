"""`mail test ADDRESS`: one line saying how the server answered, exit 1 when the send failed."""

import pytest
from mailserver import free_port, mail_server


def test_mail_test_sends_at_once_and_prints_the_servers_answer(make_app, database_url):
    with mail_server() as smtp:
        app = make_app({"DATABASE_URL": database_url, "MAIL_URL": smtp.url})
        result = app.test_cli_runner().invoke(args=["mail", "test", "ops@example.com"])
        [mail] = smtp.wait_for(1)
    assert result.exit_code == 0, result.output
    assert result.output == (f"Sent a test mail to ops@example.com through smtp://127.0.0.1:{smtp.port}: "
                             "250 Message accepted for delivery\n")
    assert mail.subject == "A test mail"


def test_mail_test_says_why_it_failed_in_one_line(make_app, database_url):
    app = make_app({"DATABASE_URL": database_url, "MAIL_URL": f"smtp://127.0.0.1:{free_port()}"})
    result = app.test_cli_runner().invoke(args=["mail", "test", "ops@example.com"])
    assert result.exit_code == 1
    assert result.output.endswith(": The mail server refused the connection.\n")
    assert result.output.count("\n") == 1


def test_mail_test_with_the_console_writes_the_mail_to_the_log(make_app, database_url, caplog):
    app = make_app({"DATABASE_URL": database_url, "MAIL_URL": "console"})
    result = app.test_cli_runner().invoke(args=["mail", "test", "ops@example.com"])
    assert result.exit_code == 0
    assert result.output == ("Sent a test mail to ops@example.com through console: "
                             "written to the log (MAIL_URL is console)\n")
    assert "Mail to ops@example.com | It changes nothing; if it reached you, mail works." in caplog.text


@pytest.mark.parametrize("address", ["nobody", "a@b.c\r\nBcc: x@y.z", "bücher@example.com",
                                     "=?utf-8?q?a=0d=0a?=@example.com"])
def test_mail_test_refuses_an_address_it_cannot_send_to(make_app, database_url, address):
    app = make_app({"DATABASE_URL": database_url, "MAIL_URL": "console"})
    result = app.test_cli_runner().invoke(args=["mail", "test", address])
    assert result.exit_code == 1 and "That address cannot be mailed" in result.output
    assert "Traceback" not in result.output
