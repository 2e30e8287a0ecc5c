"""The operator's command line (`flask --app app ...`): a module a command group, what they share in commands.py."""
