"""Usage to billing: closed hours of usage sent to a billing system through an outbox."""
