"""Webhooks (Standard Webhooks 1.0): endpoints, the outbox of messages, signing, delivery, the address check and the Security tab's section."""
