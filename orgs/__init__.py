"""Organisations: who may do what (roles.py), members and invitations (members.py, invitations.py),
and their keys' actions (keyactions.py)."""
