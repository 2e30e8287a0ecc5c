"""Mail: the outbox of mails, the SMTP server they go through, and the notices the service sends."""
