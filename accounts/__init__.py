"""The account domain: users and their sessions, two-factor log-in, the security log."""
