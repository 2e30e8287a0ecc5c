"""Webhooks (Standard Webhooks 1.0): endpoints, the outbox, signing, delivery, the address check, their Security tab."""
